package dlock

import (
	"context"
	"sync"
	"time"

	"github.com/dlock-go/dlock/internal/engine"
	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/lease"
	"github.com/dlock-go/dlock/internal/telemetry"
)

// Permit is a grant of permits from a Semaphore: a lease, renewed by the
// watchdog unless WithPermitLease fixed it. Release it exactly once. A
// Permit's methods are safe for concurrent use. A Permit of no permits
// (from Acquire(ctx, 0), or a Drain that found none) holds nothing in Redis.
type Permit struct {
	s  *Semaphore
	id string
	n  int
	l  *lease.Hold // nil for a Permit of no permits

	mu   sync.Mutex
	done bool // Release succeeded, or found the permit gone
}

// Count returns how many permits p holds.
func (p *Permit) Count() int { return p.n }

// Token returns the permit's fencing token: never 0 for a permit that holds
// permits, and strictly greater than the token of every permit taken
// earlier from the same semaphore. A Permit of no permits has none (0).
func (p *Permit) Token() uint64 {
	if p.l == nil {
		return 0
	}
	return p.l.Token
}

// Release gives the permits back and wakes the waiters they can serve. A
// second Release, or one after the lease expired, returns an error matching
// ErrNotHeld (and ErrLost, when the lease ran out) and changes no count.
// Like Mutex.Unlock, it runs even when ctx has ended, it returns nil when
// Redis released the permits although Lost fired on the way, and when it
// fails the permit is no longer renewed: it ends by its lease at the
// latest. Releasing
// a Permit of no permits does nothing.
func (p *Permit) Release(ctx context.Context) (err error) {
	if p.l == nil {
		return nil
	}
	s := p.s
	ctx, sp, err := s.h.Begin(ctx, "dlock.Permit.Release")
	defer func() { sp.EndRelease(err) }()
	telemetry.Annotate(ctx, telemetry.AttrPermits.Int(p.n))
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return errs.Op("release", s.h.Name, "", ErrNotHeld)
	}
	if err := s.h.LostAlready("release", p.l); err != nil {
		p.done = true
		return err
	}
	s.h.BeginRelease(p.l)
	n, err := s.release(engine.Detach(ctx), p.id)
	if err == nil {
		p.done = true
		n = min(n, 0) // 0: released; -1: held none
	}
	return s.h.SettleRelease("release", p.l, n, err, true)
}

// Extend makes the permit end lease from now (see Mutex.Extend). After
// Release it returns an error matching ErrNotHeld; a Permit of no permits
// has nothing to extend, and Extend does nothing.
func (p *Permit) Extend(ctx context.Context, lease time.Duration) error {
	if p.l == nil {
		return nil
	}
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	l := p.l
	if done {
		l = nil
	}
	return p.s.h.Extend(ctx, "dlock.Permit.Extend", l, lease)
}

// Lost returns a channel that is closed if the permit's lease is lost (it
// expired, renewals failed for a whole lease, or the Client closed). Release
// does not close it. A Permit of no permits returns nil, which never fires.
func (p *Permit) Lost() <-chan struct{} {
	if p.l == nil {
		return nil
	}
	return p.s.h.C.WD.LostOf(p.l)
}

// HoldContext returns a copy of parent that is cancelled when the permit
// ends: by Release, or by loss, in which case context.Cause reports an error
// matching ErrLost. Call the CancelFunc when done. For a Permit of no
// permits, the context is already cancelled, with cause ErrNotHeld.
func (p *Permit) HoldContext(parent context.Context) (context.Context, context.CancelFunc) {
	return p.s.h.C.WD.HoldContext(parent, p.l)
}
