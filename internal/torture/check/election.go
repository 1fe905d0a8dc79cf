package check

import (
	"fmt"

	"github.com/dlock-go/dlock/internal/torture/history"
)

// checkElection checks that the tokens of an election's terms strictly
// rise in the order the Campaigns completed (that terms do not overlap is
// the linearizability and lost-before-acquired checkers' business).
func (r *run) checkElection() Result {
	res := Result{Name: ElectionTerms}
	for _, hs := range r.groupHolds(func(h *hold) bool { return h.space == history.Election }) {
		var top *hold // the term with the highest token so far
		for _, h := range hs {
			res.Checked++
			if top != nil && h.tok <= top.tok {
				res.add(Violation{Space: h.space, Name: h.name, What: fmt.Sprintf(
					"term token %d not above the earlier term's %d: %s; earlier %s; events %s / %s",
					h.tok, top.tok, r.holdStr(h), r.holdStr(top), r.desc(h.acqEv), r.desc(top.acqEv))})
			}
			if top == nil || h.tok > top.tok {
				top = h
			}
		}
	}
	res.note("%d terms", res.Checked)
	return res
}
