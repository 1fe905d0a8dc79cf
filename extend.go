package dlock

import (
	"context"
	"fmt"
	"time"

	"github.com/dlock-go/dlock/internal/lease"

	"github.com/dlock-go/dlock/internal/scripts"
)

// Extend, shared by every primitive that has one (Mutex, ReentrantMutex,
// RWMutex, Permit): one call of internal/scripts/renew.lua that sets the hold's
// lease to the new one, from the server's now, if the hold is still there.
// From then on the watchdog no longer renews the hold: it ends by the new
// lease unless Extend is called again or it is released first.
//
// A renewal sent before the Extend could reach the server after it and set
// the watchdog's lease back over the new one; so the Extend first stops the
// hold's renewals and waits for one in flight to settle (at most the hold's
// lease left, the deadline a renewal request carries).

// extend runs Extend for hold l (nil when the caller holds nothing).
func (h *handle) extend(ctx context.Context, spanName string, l *lease.Hold, d time.Duration) error {
	return h.extendBy(ctx, spanName, l, d, func(ctx context.Context) (lease.ExtendOutcome, error) {
		keys := append([]string{l.Key}, l.Extra...)
		res, err := h.c.script(ctx, scripts.Renew, keys, millis(d), l.Arg).Int64Slice()
		if err == nil && len(res) != 1 {
			err = fmt.Errorf("unexpected reply %v", res)
		}
		switch {
		case err != nil:
			return lease.ExtendUnknown, h.fail("extend", err)
		case res[0] != 1:
			return lease.ExtendGone, nil
		}
		return lease.ExtendApplied, nil
	})
}

// extendBy is the part of Extend every lock shares (a Redlock's too): the
// span, the checks, stopping the renewals, and recording the outcome. apply
// sets the new lease on the server(s); with extendUnknown it returns the
// error to report.
func (h *handle) extendBy(ctx context.Context, spanName string, l *lease.Hold, d time.Duration, apply func(ctx context.Context) (lease.ExtendOutcome, error)) (err error) {
	const op = "extend"
	ctx, sp, err := h.begin(ctx, spanName)
	defer func() { sp.EndOther(err) }()
	switch {
	case err != nil:
		return err
	case leaseOutOfBounds("lease", d) != "":
		return opErr(op, h.name, leaseOutOfBounds("lease", d), ErrInvalid)
	case l == nil:
		return opErr(op, h.name, "", ErrNotHeld)
	}
	w := h.c.wd
	if err := w.BeginExtend(ctx, &l.Lease); err != nil {
		return opErr(op, h.name, "", err)
	}
	sent := time.Now()
	outcome, err := apply(ctx)
	w.Extended(&l.Lease, d, sent, outcome)
	switch outcome {
	case lease.ExtendUnknown:
		return err
	case lease.ExtendGone:
		if cause := w.LostCause(l); cause != nil {
			return opErr(op, h.name, "", cause)
		}
		return opErr(op, h.name, "", ErrNotHeld) // released meanwhile
	}
	if cause := w.LostCause(l); cause != nil {
		return opErr(op, h.name, "", cause)
	}
	return nil
}
