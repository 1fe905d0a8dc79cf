package engine

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/lease"
	"github.com/dlock-go/dlock/internal/wire"
)

// The release lifecycle, shared by every call that gives a hold up (Unlock,
// RUnlock, Release): the primitive marks its hold as being released (so that
// a renewal racing the release does not report it lost), runs its release
// script, and hands the outcome to SettleRelease, which ends the hold or
// keeps it, and says what the caller returns. Whom the release wakes is the
// primitive's own rule.

// LostAlready returns the error of a release of l, for op, when l was lost
// before it: the release then sends nothing (the hold's lease ran out, or
// Redis said it was gone; what is left of it on the server expires within
// the drift margin), and the caller learns at once that it was lost, rather
// than a network error after a round trip to a server that may be down.
func (h *Handle) LostAlready(op string, l *lease.Hold) error {
	if cause := h.C.WD.LostCause(l); cause != nil {
		return errs.Op(op, h.Name, "", cause, errs.ErrNotHeld)
	}
	return nil
}

// BeginRelease marks l as being released; nil (nothing tracked) is allowed.
func (h *Handle) BeginRelease(l *lease.Hold) {
	if l != nil {
		h.C.WD.BeginRelease(&l.Lease)
	}
}

// SettleRelease records the outcome of op's release script for hold l (nil
// when this Core tracks none): err when the script failed to run, else
// remaining, the holds the owner has left (0: released; -1: it held none;
// more: a counted hold that goes on). unique says that l's holder ID is
// unique to its acquisition, so that a script that released it proves l
// was held until then (see lease.Watchdog.Released).
func (h *Handle) SettleRelease(op string, l *lease.Hold, remaining int64, err error, unique bool) error {
	w := h.C.WD
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
			return errs.Op(op, h.Name, "", cause)
		}
		return nil
	case remaining < 0 && l == nil:
		return errs.Op(op, h.Name, "", errs.ErrNotHeld)
	case remaining < 0:
		w.Lose(&l.Lease, fmt.Errorf("%w: hold gone at %s", errs.ErrLost, op))
		return errs.Op(op, h.Name, "", errs.ErrLost, errs.ErrNotHeld)
	case l != nil:
		if cause := w.Released(&l.Lease, unique); cause != nil {
			return errs.Op(op, h.Name, "", cause)
		}
	}
	return nil
}

// SettleHandover reads a releasing script's reply, {n, ""} or {n, ids,
// token, ttl ms}, and wakes the waiters of this Core it handed the lock
// to, if any. It returns n.
func (h *Handle) SettleHandover(res []any) (int64, error) {
	n, next, err := wire.DecodePair(res[:min(len(res), 2)])
	if err != nil || next == "" || len(res) < 4 {
		return n, err
	}
	s, _ := res[2].(string)
	token, _ := strconv.ParseUint(s, 10, 64)
	ms, _ := res[3].(int64)
	h.handedTo(strings.Split(next, ","), token, time.Duration(ms)*time.Millisecond)
	return n, nil
}

// ForceUnlock runs a ForceUnlock call whose script, run, answers as a
// releasing script does ({1 when it was held, else 0, and whom it handed
// the lock to}), and wakes this Core's waiters it handed the lock to. lose
// reports the holds of this Core on the lock lost; holders elsewhere learn
// at their next renewal.
func (h *Handle) ForceUnlock(ctx context.Context, spanName string, run func(context.Context) ([]any, error), lose func(cause error)) (released bool, err error) {
	ctx, sp, err := h.Begin(ctx, spanName)
	defer func() { sp.EndOther(err) }()
	if err != nil {
		return false, err
	}
	res, err := run(Detach(ctx))
	if err != nil {
		h.WakeUnknown(err)
		return false, h.Fail("forceunlock", err)
	}
	n, err := h.SettleHandover(res)
	if n == 1 {
		lose(fmt.Errorf("%w: force-unlocked", errs.ErrLost))
	}
	return n == 1, err
}
