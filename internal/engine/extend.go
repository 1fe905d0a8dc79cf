package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/lease"
	"github.com/dlock-go/dlock/internal/scripts"
	"github.com/dlock-go/dlock/internal/wire"
)

// Extend, shared by every primitive that has one (Mutex, ReentrantMutex,
// RWMutex, Permit): one call of internal/scripts/renew.lua that sets the
// hold's lease to the new one, from the server's now, if the hold is still
// there. From then on the watchdog no longer renews the hold: it ends by
// the new lease unless Extend is called again or it is released first.
//
// A renewal sent before the Extend could reach the server after it and set
// the watchdog's lease back over the new one; so the Extend first stops the
// hold's renewals and waits for one in flight to settle (at most the hold's
// lease left, the deadline a renewal request carries).

// Extend runs Extend for hold l (nil when the caller holds nothing).
func (h *Handle) Extend(ctx context.Context, spanName string, l *lease.Hold, d time.Duration) error {
	return h.ExtendBy(ctx, spanName, l, d, func(ctx context.Context) (lease.ExtendOutcome, error) {
		keys := append([]string{l.Key}, l.Extra...)
		res, err := h.C.Script(ctx, scripts.Renew, keys, wire.Millis(d), l.Arg).Int64Slice()
		if err == nil && len(res) != 1 {
			err = fmt.Errorf("unexpected reply %v", res)
		}
		switch {
		case err != nil:
			return lease.ExtendUnknown, h.Fail("extend", err)
		case res[0] != 1:
			return lease.ExtendGone, nil
		}
		return lease.ExtendApplied, nil
	})
}

// ExtendBy is the part of Extend every lock shares (a Redlock's too): the
// span, the checks, stopping the renewals, and recording the outcome. apply
// sets the new lease on the server(s); with ExtendUnknown it returns the
// error to report.
func (h *Handle) ExtendBy(ctx context.Context, spanName string, l *lease.Hold, d time.Duration, apply func(ctx context.Context) (lease.ExtendOutcome, error)) (err error) {
	const op = "extend"
	ctx, sp, err := h.Begin(ctx, spanName)
	defer func() { sp.EndOther(err) }()
	switch {
	case err != nil:
		return err
	case lease.OutOfBounds("lease", d) != "":
		return errs.Op(op, h.Name, lease.OutOfBounds("lease", d), errs.ErrInvalid)
	case l == nil:
		return errs.Op(op, h.Name, "", errs.ErrNotHeld)
	}
	w := h.C.WD
	if err := w.BeginExtend(ctx, &l.Lease); err != nil {
		return errs.Op(op, h.Name, "", err)
	}
	sent := time.Now()
	outcome, err := apply(ctx)
	w.Extended(&l.Lease, d, sent, outcome)
	switch outcome {
	case lease.ExtendUnknown:
		return err
	case lease.ExtendGone:
		if cause := w.LostCause(l); cause != nil {
			return errs.Op(op, h.Name, "", cause)
		}
		return errs.Op(op, h.Name, "", errs.ErrNotHeld) // released meanwhile
	}
	if cause := w.LostCause(l); cause != nil {
		return errs.Op(op, h.Name, "", cause)
	}
	return nil
}
