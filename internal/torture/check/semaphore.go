package check

import (
	"fmt"
	"sort"
	"strings"

	"github.com/dlock-go/dlock/internal/torture/history"
)

const totalPrefix = "total:"

// checkSemaphores sweeps each semaphore's permits over time: at no instant
// may the permits held exceed the total then in force, and the permits
// available after the run must be the final total.
func (r *run) checkSemaphores() Result {
	res := Result{Name: SemaphoreSweep}
	totals := map[string][]int{} // name -> Setting events
	finals := map[string][]int{} // name -> FinalAvailable events
	names := map[string]bool{}
	for i := range r.evs {
		e := &r.evs[i]
		if !nemesis(e) {
			continue
		}
		switch {
		case e.F == history.Setting && strings.HasPrefix(e.Name, totalPrefix):
			n := strings.TrimPrefix(e.Name, totalPrefix)
			totals[n] = append(totals[n], i)
			names[n] = true
		case e.F == history.FinalAvailable:
			finals[e.Name] = append(finals[e.Name], i)
			names[e.Name] = true
		}
	}
	groups := map[string][]*hold{}
	for _, hs := range r.groupHolds(func(h *hold) bool { return h.space == history.Semaphore }) {
		groups[hs[0].name] = hs
		names[hs[0].name] = true
	}
	sorted := make([]string, 0, len(names))
	for n := range names {
		sorted = append(sorted, n)
	}
	sort.Strings(sorted)
	permits := 0
	for _, name := range sorted {
		ts := totals[name]
		if len(ts) == 0 {
			res.add(Violation{Space: history.Semaphore, Name: name, What: "no Setting " + totalPrefix + name + ": the permits cannot be checked"})
			continue
		}
		permits += len(groups[name])
		r.sweep(&res, name, groups[name], ts)
		final := r.evs[ts[len(ts)-1]].N
		for _, f := range finals[name] {
			res.Checked++
			if got := r.evs[f].N; got != final {
				res.add(Violation{Space: history.Semaphore, Name: name, What: fmt.Sprintf(
					"permits not all back: %d available after the run, total %d; events %s / %s", got, final, r.desc(f), r.desc(ts[len(ts)-1]))})
			}
		}
	}
	res.note("%d permits over %d semaphores", permits, len(sorted))
	return res
}

// sweep checks one semaphore's holds against its totals (Setting events).
func (r *run) sweep(res *Result, name string, hs []*hold, totals []int) {
	type change struct {
		t     int64
		order int // at one instant: releases, then totals, then acquisitions
		h     *hold
		total int64
	}
	var cs []change
	for _, h := range hs {
		res.Checked++
		end, kind, ok := h.modelEnd()
		switch kind {
		case endPaused:
			res.exempt("permits ended at a pause")
		case endDataLoss:
			res.exempt("permits ended at data loss")
		}
		endT := inf
		if ok {
			endT = end.from
		}
		if endT < h.acq.to {
			continue // ended (by an exemption) before its acquisition completed
		}
		cs = append(cs, change{t: h.acq.to, order: 2, h: h})
		if endT != inf {
			cs = append(cs, change{t: endT, order: 0, h: h})
		}
	}
	for _, i := range totals {
		cs = append(cs, change{t: r.evs[i].T, order: 1, total: r.evs[i].N})
	}
	sort.SliceStable(cs, func(i, j int) bool {
		return cs[i].t < cs[j].t || cs[i].t == cs[j].t && cs[i].order < cs[j].order
	})
	total := int64(-1) // no total before the first setting: nothing to check
	var sum int64
	held := map[*hold]bool{}
	over := false
	for _, c := range cs {
		switch c.order {
		case 0:
			sum -= c.h.n
			delete(held, c.h)
		case 1:
			total = c.total
		case 2:
			sum += c.h.n
			held[c.h] = true
		}
		if total < 0 || sum <= total {
			over = false
			continue
		}
		if over {
			continue // one violation per excursion above the total
		}
		over = true
		var list []*hold
		for h := range held {
			list = append(list, h)
		}
		sort.Slice(list, func(i, j int) bool { return list[i].acq.to < list[j].acq.to })
		var b strings.Builder
		fmt.Fprintf(&b, "at %s %d permits held, total %d:", r.at(c.t), sum, total)
		for _, h := range list {
			fmt.Fprintf(&b, " [%s]", r.holdStr(h))
		}
		res.add(Violation{Space: history.Semaphore, Name: name, What: b.String()})
	}
}
