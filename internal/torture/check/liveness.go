package check

import (
	"fmt"
	"sort"
	"time"

	"github.com/dlock-go/dlock/internal/torture/history"
)

// faultEnds pairs each nemesis fault's start with its end; instants are
// faults of their own.
var (
	faultEnds = map[string]string{
		history.Pause: history.Resume, history.Partition: history.Heal, history.Latency: history.LatencyEnd,
		history.KillRedis: history.RestartRedis, history.FailoverStart: history.FailoverEnd,
		history.MasterPause: history.MasterResume, history.MasterKill: history.MasterRestart,
	}
	faultInstants = map[string]bool{history.Reset: true, history.ScriptFlush: true, history.KillPubSub: true}
)

// checkLiveness: every invocation completes; no blocking acquisition waits
// on a free lock for longer than Lease+Period outside fault windows; no key
// is left without a TTL.
func (r *run) checkLiveness(rep *Report) Result {
	res := Result{Name: Liveness}
	for _, i := range r.stranded {
		res.Checked++
		res.add(Violation{Space: history.Space(r.evs[i].Prim), Name: r.evs[i].Name, What: "never completed: " + r.desc(i)})
	}
	for _, i := range r.orphans {
		res.add(Violation{Space: history.Space(r.evs[i].Prim), Name: r.evs[i].Name, What: "completion without invocation: " + r.desc(i)})
	}
	for i := range r.evs {
		switch e := &r.evs[i]; {
		case e.Kind == history.Invoke:
			res.Checked++
		case nemesis(e) && e.F == history.KeyWithoutTTL:
			res.add(Violation{Name: e.Name, What: fmt.Sprintf("key %q left without a TTL: %s", e.Name, r.desc(i))})
		}
	}
	r.waits(&res, rep)
	return res
}

// faultWindows returns the windows [start, end+bound] of every fault,
// merged and sorted. A fault with no end lasts until the history ends.
func (r *run) faultWindows() []span {
	var ws []span
	open := map[[2]string][]int64{} // (start function, target) -> starts
	for i := range r.evs {
		e := &r.evs[i]
		if !nemesis(e) {
			continue
		}
		switch {
		case faultInstants[e.F]:
			ws = append(ws, span{e.T, e.T})
		case faultEnds[e.F] != "":
			k := [2]string{e.F, e.Target}
			open[k] = append(open[k], e.T)
		default:
			for start, end := range faultEnds {
				k := [2]string{start, e.Target}
				if end == e.F && len(open[k]) > 0 {
					ws = append(ws, span{open[k][0], e.T})
					open[k] = open[k][1:]
				}
			}
		}
	}
	for _, starts := range open {
		for _, t := range starts {
			ws = append(ws, span{t, r.horizon})
		}
	}
	for i := range ws {
		ws[i].to = satAdd(ws[i].to, int64(r.bound))
	}
	sort.Slice(ws, func(i, j int) bool { return ws[i].from < ws[j].from })
	return mergeSpans(ws)
}

func satAdd(a, b int64) int64 {
	if a > inf-b {
		return inf
	}
	return a + b
}

// mergeSpans merges overlapping spans sorted by from.
func mergeSpans(ws []span) []span {
	var out []span
	for _, w := range ws {
		if n := len(out); n > 0 && w.from <= out[n-1].to {
			out[n-1].to = max(out[n-1].to, w.to)
			continue
		}
		out = append(out, w)
	}
	return out
}

// intersects reports whether sp meets one of the merged, sorted spans ws.
func intersects(ws []span, sp span) bool {
	k := sort.Search(len(ws), func(i int) bool { return ws[i].to >= sp.from })
	return k < len(ws) && ws[k].from <= sp.to
}

// waits finds blocking acquisitions pending while their lock was free.
// A name is busy while a hold is held (acquisition completion to the lock
// known free: release completion, Lost; never, for a release of unknown
// outcome), while a MultiLock over it is pending (it holds the earlier
// members while it waits for later ones), and from the invocation of an
// acquisition of unknown outcome until a lease after its completion (it
// may have taken the lock). The rest, from the history's start, is free.
func (r *run) waits(res *Result, rep *Report) {
	type key struct{ space, name string }
	busy := map[key][]span{}
	waiters := map[key][]int{} // invocation indexes
	for _, h := range r.holds {
		if exclusiveSpaces[h.space] {
			k := key{h.space, h.name}
			busy[k] = append(busy[k], span{h.acq.to, h.freeAt})
		}
	}
	for i, e := range r.evs {
		if e.Kind != history.Invoke || !acquireFns[e.F] {
			continue
		}
		space := history.Space(e.Prim)
		if !exclusiveSpaces[space] {
			continue
		}
		c := r.callAt(i)
		done := c.doneT(r.horizon)
		switch {
		case e.Prim == history.MultiLock:
			for _, n := range c.names() {
				k := key{space, n}
				busy[k] = append(busy[k], span{e.T, done})
			}
			continue // it waits on its members one by one: not judged
		case c.done == nil:
			busy[key{space, c.name()}] = append(busy[key{space, c.name()}], span{e.T, inf})
		case c.done.Kind == history.Info:
			busy[key{space, c.name()}] = append(busy[key{space, c.name()}], span{e.T, satAdd(done, int64(r.lease))})
		}
		if blockingFns[e.F] {
			k := key{space, c.name()}
			waiters[k] = append(waiters[k], i)
		}
	}
	faults := r.faultWindows()
	bound := int64(r.bound)
	var longest int64 = -1
	keys := make([]key, 0, len(waiters))
	for k := range waiters {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		return keys[i].space < keys[j].space || keys[i].space == keys[j].space && keys[i].name < keys[j].name
	})
	for _, k := range keys {
		bs := busy[k]
		sort.Slice(bs, func(i, j int) bool { return bs[i].from < bs[j].from })
		bs = mergeSpans(bs)
		// The free gaps: the complement of the busy spans.
		var gaps []span
		from := r.t0
		for _, b := range bs {
			if b.from > from {
				gaps = append(gaps, span{from, b.from})
			}
			from = max(from, b.to)
		}
		if from < r.tEnd {
			gaps = append(gaps, span{from, r.tEnd})
		}
		for _, i := range waiters[k] {
			c := r.callAt(i)
			w := span{c.inv.T, min(c.doneT(r.horizon), r.tEnd)}
			g := sort.Search(len(gaps), func(j int) bool { return gaps[j].to > w.from })
			for ; g < len(gaps) && gaps[g].from < w.to; g++ {
				ov := span{max(w.from, gaps[g].from), min(w.to, gaps[g].to)}
				if intersects(faults, ov) {
					if ov.to-ov.from > bound {
						res.exempt("waits on a free lock in a fault window")
					}
					continue
				}
				if ov.to-ov.from > longest {
					longest = ov.to - ov.from
					rep.LongestWait = time.Duration(longest)
					rep.LongestWaitWhere = fmt.Sprintf("%s %q %s: %s", k.space, k.name, r.spanStr(ov), r.desc(i))
				}
				if ov.to-ov.from > bound {
					res.add(Violation{Space: k.space, Name: k.name, What: fmt.Sprintf(
						"waited %v on a free lock %s (bound %v, no fault near): %s; completed: %s",
						time.Duration(ov.to-ov.from), r.spanStr(ov), r.bound, r.desc(i), r.desc(c.doneIdx))})
				}
			}
		}
	}
	res.note("longest wait on a free lock outside fault windows: %v (bound %v)", max(time.Duration(longest), 0), r.bound)
}
