package dlock

import (
	"fmt"

	"github.com/dlock-go/dlock/internal/lease"
)

// The release lifecycle, shared by every call that gives a hold up (Unlock,
// RUnlock, Release): the primitive marks its hold as being released (so that
// a renewal racing the release does not report it lost), runs its release
// script, and hands the outcome to settleRelease, which ends the hold or
// keeps it, and says what the caller returns. Whom the release wakes is the
// primitive's own rule.

// beginRelease marks l as being released; nil (nothing tracked) is allowed.
func (h *handle) beginRelease(l *lease.Hold) {
	if l != nil {
		h.c.wd.BeginRelease(&l.Lease)
	}
}

// settleRelease records the outcome of op's release script for hold l (nil
// when this Client tracks none): err when the script failed to run, else
// remaining, the holds the owner has left (0: released; -1: it held none;
// more: a counted hold that goes on). unique says that l's holder ID is
// unique to its acquisition, so that a script that released it proves l
// was held until then (see lease.Watchdog.Released).
func (h *handle) settleRelease(op string, l *lease.Hold, remaining int64, err error, unique bool) error {
	w := h.c.wd
	switch {
	case err != nil:
		if l != nil {
			w.AbortRelease(&l.Lease, true) // renewals stop: the hold ends by its lease
		}
		return err
	case remaining > 0:
		if l == nil {
			return nil
		}
		w.AbortRelease(&l.Lease, false) // still held: renewals go on
		l.Count = remaining
		if cause := w.LostCause(l); cause != nil {
			return opErr(op, h.name, "", cause)
		}
		return nil
	case remaining < 0 && l == nil:
		return opErr(op, h.name, "", ErrNotHeld)
	case remaining < 0:
		w.Lose(&l.Lease, fmt.Errorf("%w: hold gone at %s", ErrLost, op))
		return opErr(op, h.name, "", ErrLost, ErrNotHeld)
	case l != nil:
		if cause := w.Released(&l.Lease, unique); cause != nil {
			return opErr(op, h.name, "", cause)
		}
	}
	return nil
}
