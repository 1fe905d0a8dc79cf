package check

import (
	"sort"

	"github.com/anishathalye/porcupine"

	"github.com/dlock-go/dlock/internal/torture/history"
)

// holdOps locates a hold's operations in partition.ops: ops[0] is its
// acquisition; when ended, the last is its end.
type holdOps struct {
	h     *hold
	ops   []int
	ended bool
}

// tighten helps porcupine's search without changing its verdict. Blocked
// acquisitions have long intervals, and porcupine tries every pending one
// wherever the lock is free: for RW readers, every subset of them, which
// explodes. But the models order holds: an acquisition of a free lock needs
// a token above every earlier one, so the token-bearing holds (mutex,
// reentrant, RW write) follow token order, and every hold is ended by its
// own operations only (identities are unique per hold). So in every
// linearization:
//
//   - a token-bearing hold's acquisition follows every operation of the
//     hold with the next lower token, hence their calls;
//   - an RW read hold that cannot precede the writers from some writer on
//     (its operations were called after one of their acquisitions
//     returned) follows the writers before: its acquisition follows their
//     operations' calls;
//   - a writer follows every reader that cannot follow it (the reader's
//     acquisition returned before the writer's last call).
//
// Moving an acquisition's call up to such a bound keeps every
// linearization, and adds none (intervals only shrink). A move past the
// acquisition's return is left out: no linearization exists then, and
// porcupine finds that by itself. Readers whose owner also writes on the
// name are left alone (an owner's reads do not conflict with its writes).
func tighten(p *partition) {
	if len(p.holds) < 2 {
		return
	}
	var writers, readers []holdOps
	for _, x := range p.holds {
		if x.h.read {
			readers = append(readers, x)
		} else {
			writers = append(writers, x)
		}
	}
	sort.Slice(writers, func(i, j int) bool { return writers[i].h.tok < writers[j].h.tok })
	for i, w := range writers {
		if w.h.tok == 0 || i > 0 && w.h.tok == writers[i-1].h.tok {
			return // the models do not order these holds
		}
	}
	p.orig = append([]porcupine.Operation(nil), p.ops...)
	for i := 1; i < len(writers); i++ {
		if writers[i-1].ended {
			p.raiseCall(writers[i].ops[0], p.maxCall(writers[i-1]))
		}
	}
	if p.space != history.RW || len(readers) == 0 {
		return
	}
	writes := map[string]bool{}
	for _, w := range writers {
		writes[w.h.holder] = true
	}
	rs := readers[:0]
	for _, r := range readers {
		if !writes[r.h.holder] {
			rs = append(rs, r)
		}
	}
	m := len(writers)
	// sufmin[s]: the earliest return of the acquisitions of writers s..m-1.
	sufmin := make([]int64, m+1)
	sufmin[m] = inf
	for s := m - 1; s >= 0; s-- {
		sufmin[s] = min(sufmin[s+1], p.ops[writers[s].ops[0]].Return)
	}
	// prefmax[s]: the latest call of the operations of writers 0..s-1
	// (inf once one of them never ends: nothing can follow it).
	prefmax := make([]int64, m+1)
	for s := 1; s <= m; s++ {
		c := inf
		if writers[s-1].ended {
			c = p.maxCall(writers[s-1])
		}
		prefmax[s] = max(prefmax[s-1], c)
	}
	for _, r := range rs {
		last := p.maxCall(r)
		lo := sort.Search(m+1, func(s int) bool { return sufmin[s] >= last })
		if lo > 0 && prefmax[lo] != inf {
			p.raiseCall(r.ops[0], prefmax[lo])
		}
	}
	// Writers after the readers that cannot follow them.
	sort.Slice(rs, func(i, j int) bool { return p.ops[rs[i].ops[0]].Return < p.ops[rs[j].ops[0]].Return })
	rmax := make([]int64, len(rs)+1) // rmax[k]: the latest call of readers 0..k-1's operations
	for k, r := range rs {
		c := inf
		if r.ended {
			c = p.maxCall(r)
		}
		rmax[k+1] = max(rmax[k], c)
	}
	for _, w := range writers {
		last := p.maxCall(w)
		k := sort.Search(len(rs), func(i int) bool { return p.ops[rs[i].ops[0]].Return >= last })
		if k > 0 && rmax[k] != inf {
			p.raiseCall(w.ops[0], rmax[k])
		}
	}
}

func (p *partition) maxCall(x holdOps) int64 {
	c := int64(0)
	for _, i := range x.ops {
		c = max(c, p.ops[i].Call)
	}
	return c
}

// raiseCall moves operation i's call up to c, unless that passes its return.
func (p *partition) raiseCall(i int, c int64) {
	if op := &p.ops[i]; c > op.Call && c <= op.Return {
		op.Call = c
	}
}
