package check

import (
	"fmt"
	"sort"
	"time"
)

// groupHolds returns the holds of the spaces keep selects, by space and
// name, each group sorted by acquisition completion; the groups in a
// stable order.
func (r *run) groupHolds(keep func(*hold) bool) [][]*hold {
	idx := map[string]int{}
	var groups [][]*hold
	for _, h := range r.holds {
		if !keep(h) {
			continue
		}
		k := h.space + "\x00" + h.name
		i, ok := idx[k]
		if !ok {
			i = len(groups)
			idx[k] = i
			groups = append(groups, nil)
		}
		groups[i] = append(groups[i], h)
	}
	for _, g := range groups {
		sort.SliceStable(g, func(i, j int) bool { return g[i].acq.to < g[j].acq.to })
	}
	return groups
}

// conflict reports whether two holds on one name exclude each other: other
// holders (owners), and for RW not both readers.
func conflict(a, b *hold) bool {
	return a != b && a.holder != b.holder && !(a.read && b.read)
}

// paused reports whether a pause may explain b acquiring while a was
// active: a process of a paused between a's invocation and b's completion
// (a's lease ran out meanwhile), or a process of b paused between b's
// invocation and a's completion (b took the lock first and reported late).
func (r *run) paused(a, b *hold) bool {
	for _, p := range a.procs {
		if r.firstIn(r.pauses[p], span{a.acq.from, b.acq.to}) >= 0 {
			return true
		}
	}
	for _, p := range b.procs {
		if r.firstIn(r.pauses[p], span{b.acq.from, a.acq.to}) >= 0 {
			return true
		}
	}
	return false
}

// checkLost checks the headline promise: a holder is told it lost the
// lock (or releases it) before another holder acquires it.
func (r *run) checkLost(rep *Report) Result {
	res := Result{Name: LostBeforeAcquired}
	var leads []time.Duration
	for _, hs := range r.groupHolds(func(h *hold) bool { return exclusiveSpaces[h.space] }) {
		var active []*hold // holds whose end has not started yet
		for _, b := range hs {
			res.Checked++
			tB := b.acq.to
			keep := active[:0]
			for _, a := range active {
				if a.endStart > tB {
					keep = append(keep, a)
				}
			}
			active = keep
			for _, a := range active {
				if a.acq.to >= tB || !conflict(a, b) {
					continue
				}
				switch {
				case r.paused(a, b):
					res.exempt("paused past lease")
				case r.firstIn(r.dataLoss[b.space], span{min(a.acq.from, b.acq.from), tB}) >= 0:
					res.exempt("data loss")
				default:
					res.add(Violation{Space: b.space, Name: b.name, What: fmt.Sprintf(
						"acquired while another hold was active: %s; while %s; the first holder's end started %s, after the second's acquisition completed %s; events %s / %s",
						r.holdStr(b), r.holdStr(a), r.at(a.endStart), r.at(tB), r.desc(b.acqEv), r.desc(a.acqEv))})
				}
			}
			active = append(active, b)
		}
		// How long before the next holder the lost holder was told.
		for i, a := range hs {
			if !a.hasLost || a.kind == endRelease {
				continue
			}
			for _, b := range hs[i+1:] {
				if conflict(a, b) {
					leads = append(leads, time.Duration(b.acq.to-a.lostT))
					break
				}
			}
		}
	}
	rep.LostLead = figure(leads)
	res.note("%d holds checked against the holds active when they were acquired", res.Checked)
	res.note("Lost to next acquisition: %v", rep.LostLead)
	return res
}
