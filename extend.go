package dlock

import (
	"container/heap"
	"context"
	"fmt"
	"time"

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
func (h *handle) extend(ctx context.Context, spanName string, l *hold, lease time.Duration) error {
	return h.extendBy(ctx, spanName, l, lease, func(ctx context.Context) (extendOutcome, error) {
		keys := append([]string{l.key}, l.extra...)
		res, err := h.c.script(ctx, scripts.Renew, keys, millis(lease), l.arg).Int64Slice()
		if err == nil && len(res) != 1 {
			err = fmt.Errorf("unexpected reply %v", res)
		}
		switch {
		case err != nil:
			return extendUnknown, h.fail("extend", err)
		case res[0] != 1:
			return extendGone, nil
		}
		return extendApplied, nil
	})
}

// extendBy is the part of Extend every lock shares (a Redlock's too): the
// span, the checks, stopping the renewals, and recording the outcome. apply
// sets the new lease on the server(s); with extendUnknown it returns the
// error to report.
func (h *handle) extendBy(ctx context.Context, spanName string, l *hold, lease time.Duration, apply func(ctx context.Context) (extendOutcome, error)) (err error) {
	const op = "extend"
	ctx, sp, err := h.begin(ctx, spanName)
	defer func() { sp.EndOther(err) }()
	switch {
	case err != nil:
		return err
	case leaseOutOfBounds("lease", lease) != "":
		return opErr(op, h.name, leaseOutOfBounds("lease", lease), ErrInvalid)
	case l == nil:
		return opErr(op, h.name, "", ErrNotHeld)
	}
	w := h.c.wd
	if err := w.beginExtend(ctx, &l.lease); err != nil {
		return opErr(op, h.name, "", err)
	}
	sent := time.Now()
	outcome, err := apply(ctx)
	w.extended(&l.lease, lease, sent, outcome)
	switch outcome {
	case extendUnknown:
		return err
	case extendGone:
		if cause := w.lostCause(l); cause != nil {
			return opErr(op, h.name, "", cause)
		}
		return opErr(op, h.name, "", ErrNotHeld) // released meanwhile
	}
	if cause := w.lostCause(l); cause != nil {
		return opErr(op, h.name, "", cause)
	}
	return nil
}

type extendOutcome uint8

const (
	extendApplied extendOutcome = iota // the server set the new lease
	extendGone                         // the server had no such hold
	extendUnknown                      // the request failed: either may be true
)

// beginExtend stops l's renewals ahead of an Extend and waits until no
// renewal of l is in flight. It returns why l ended, if it has.
func (w *watchdog) beginExtend(ctx context.Context, l *lease) error {
	w.mu.Lock()
	renew := l.renew
	for {
		if l.state != leaseHeld || l.releasing {
			w.mu.Unlock()
			if h, ok := l.of.(*hold); ok && h.cause != nil && l.state == leaseLost {
				return h.cause
			}
			return ErrNotHeld
		}
		l.renew = false
		if l.renewing == 0 {
			w.mu.Unlock()
			return nil
		}
		if w.settled == nil {
			w.settled = make(chan struct{})
		}
		settled := w.settled
		w.mu.Unlock()
		select {
		case <-settled:
		case <-ctx.Done():
			w.mu.Lock()
			if l.state == leaseHeld && renew && !l.renew {
				l.renew = true
				w.schedule(l, w.mono(time.Now()))
			}
			w.mu.Unlock()
			return ctx.Err()
		}
		w.mu.Lock()
	}
}

// extended records the outcome of an Extend of l to ttl, sent at sent.
// Applied, l now ends at its new deadline, earlier or later than before;
// gone, it is lost (unless a release of it is in flight); unknown, it ends
// by the earlier of its old and new deadlines.
func (w *watchdog) extended(l *lease, ttl time.Duration, sent time.Time, outcome extendOutcome) {
	w.mu.Lock()
	defer w.unlock()
	if l.state != leaseHeld {
		return
	}
	deadline := w.mono(leaseDeadline(sent, ttl))
	switch outcome {
	case extendGone:
		if !l.releasing {
			w.endLocked(l, leaseLost, fmt.Errorf("%w: extend found the hold gone", ErrLost))
		}
		return
	case extendUnknown:
		deadline = min(deadline, l.deadline)
	}
	l.ttl, l.grantTTL = ttl, 0
	l.sent, l.deadline = w.mono(sent), deadline
	if deadline <= w.mono(time.Now()) {
		w.endLocked(l, leaseLost, w.expiredCause(l))
		return
	}
	if l.idx >= 0 {
		heap.Fix(&w.deadlines, l.idx)
	}
	kick(w.clockKick)
}
