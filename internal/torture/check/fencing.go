package check

import (
	"fmt"
	"sort"

	"github.com/dlock-go/dlock/internal/torture/history"
)

// fwrite is one fenced write.
type fwrite struct {
	c      call
	space  string
	name   string
	tok    uint64
	inv    int64
	done   int64
	holder string
}

// checkFencing checks each guarded resource: a write admitted with token t2
// is a violation if a write with a higher token had been admitted (had
// completed) before it was invoked.
func (r *run) checkFencing() Result {
	res := Result{Name: Fencing}
	idx := map[string]int{}
	var admitted [][]fwrite
	var nAdm, nRef, nUnknown, refFlagged, refUnflagged, refNoHold int
	for i, e := range r.evs {
		if e.Kind != history.Invoke || e.F != history.Write {
			continue
		}
		c := r.callAt(i)
		w := fwrite{c: c, space: history.Space(e.Prim), name: c.name(), tok: c.tok(), inv: e.T, done: c.doneT(r.horizon), holder: c.holder()}
		switch c.kind() {
		case history.OK:
			nAdm++
			k := w.space + "\x00" + w.name
			j, ok := idx[k]
			if !ok {
				j = len(admitted)
				idx[k] = j
				admitted = append(admitted, nil)
			}
			admitted[j] = append(admitted[j], w)
		case history.Fail:
			nRef++
			switch h := r.holdAt(w.holder, w.space, w.name, w.inv); {
			case h == nil:
				refNoHold++
			case h.exempt != endOpen:
				refFlagged++
			default:
				refUnflagged++
			}
		default:
			nUnknown++
		}
	}
	// Data loss may wipe a guard's record (its store may be the main
	// server): an admission after it proves nothing.
	var losses []int64
	for f := range dataLossSpaces {
		for i := range r.evs {
			if e := &r.evs[i]; nemesis(e) && e.F == f {
				losses = append(losses, e.T)
			}
		}
	}
	sort.Slice(losses, func(i, j int) bool { return losses[i] < losses[j] })
	epoch := func(t int64) int { return sort.Search(len(losses), func(i int) bool { return losses[i] > t }) }
	for _, ws := range admitted {
		byDone := append([]fwrite(nil), ws...)
		sort.SliceStable(byDone, func(i, j int) bool { return byDone[i].done < byDone[j].done })
		byInv := ws
		sort.SliceStable(byInv, func(i, j int) bool { return byInv[i].inv < byInv[j].inv })
		var top, segTop *fwrite // highest token completed so far; since the last data loss
		seg := -1
		j := 0
		for k := range byInv {
			w2 := &byInv[k]
			res.Checked++
			for ; j < len(byDone) && byDone[j].done < w2.inv; j++ {
				w1 := &byDone[j]
				if top == nil || w1.tok > top.tok {
					top = w1
				}
				if e := epoch(w1.done); e != seg {
					seg, segTop = e, nil
				}
				if segTop == nil || w1.tok > segTop.tok {
					segTop = w1
				}
			}
			if top == nil || top.tok <= w2.tok {
				continue
			}
			if epoch(w2.done) == epoch(w2.inv) && seg == epoch(w2.inv) && segTop != nil && segTop.tok > w2.tok {
				res.add(Violation{Space: w2.space, Name: w2.name, What: fmt.Sprintf(
					"stale write admitted: token %d admitted after token %d had been: events %s / %s",
					w2.tok, segTop.tok, r.desc(w2.c.ev()), r.desc(segTop.c.ev()))})
				continue
			}
			res.exempt("stale admission after data loss")
		}
	}
	res.note("writes: %d admitted, %d refused, %d unknown", nAdm, nRef, nUnknown)
	res.note("refused writes: %d from holds ended by a pause or data loss (expected), %d from other holds, %d from no known hold", refFlagged, refUnflagged, refNoHold)
	return res
}

// holdAt returns holder's latest hold on (space, name) acquired at or
// before t, or nil.
func (r *run) holdAt(holder, space, name string, t int64) *hold {
	var best *hold
	for _, key := range r.keysFor(holder, space, name, false) {
		hs := r.byKey[key]
		for i := len(hs) - 1; i >= 0; i-- {
			if hs[i].acq.from <= t {
				if best == nil || hs[i].acq.from > best.acq.from {
					best = hs[i]
				}
				break
			}
		}
	}
	return best
}
