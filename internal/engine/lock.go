package engine

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/lease"
)

// Lock is the engine under a Mutex: how the Mutex's holds are taken and
// given up on one store. A Mutex chooses its engine when it is made: the
// Mutex engine of this package (one Redis, its cluster or its Sentinel
// deployment) or internal/redlock's (a quorum of independent masters). The
// Mutex keeps what every engine shares: its Handle, and the Slot that
// holds its current hold, which the watchdog keeps (package lease).
//
// An engine on another store (PostgreSQL, etcd) implements Lock and, for
// the watchdog, a lease.Sender that renews its holds' leases in batches;
// the public Mutex, its spans, its errors, its Lost and HoldContext, the
// lease clock and the local wait registry then work unchanged.
type Lock interface {
	// Acquire takes the lock for the Mutex, blocking (block) until it
	// holds, ctx ends or the Client closes; otherwise it makes one try. A
	// new hold is put in the Slot before Acquire returns true. A try that
	// found the lock held is (false, nil). Errors name op.
	Acquire(ctx context.Context, op string, block bool) (bool, error)
	// Release gives up l, which the caller took out of the Slot; on a
	// failure it puts l back (unless a new hold is there), so that the
	// caller may retry. Errors name op.
	Release(ctx context.Context, l *lease.Hold, op string) error
	// Extend makes l end d from now (see Handle.ExtendBy); l may be nil.
	Extend(ctx context.Context, spanName string, l *lease.Hold, d time.Duration) error
	// State reads who holds the lock (whoever it is) and what its lease has
	// left. Errors name op.
	State(ctx context.Context, op string) (ExclState, error)
	// ForceUnlock releases the lock whoever holds it, as an Unlock would,
	// and reports whether it was held.
	ForceUnlock(ctx context.Context, spanName string) (bool, error)
	// HandsOver reports whether a hold can be handed to another process by
	// its holder ID (Mutex.HandOver; ReleaseRef and ExtendRef act on one
	// store).
	HandsOver() bool
}

// Slot is a Mutex handle's current hold, shared by the Mutex and its
// engine. Its lock is a leaf: nothing else is locked under it.
type Slot struct {
	mu   sync.Mutex
	hold *lease.Hold
}

// Get returns the current hold, nil when none.
func (s *Slot) Get() *lease.Hold {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hold
}

// Take removes and returns the current hold.
func (s *Slot) Take() *lease.Hold {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.hold
	s.hold = nil
	return l
}

// TakeIf removes l if it is the current hold, and reports whether it was.
func (s *Slot) TakeIf(l *lease.Hold) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.hold != l {
		return false
	}
	s.hold = nil
	return true
}

// Restore puts l back after a release that failed, unless a new hold took
// its place meanwhile, so that the caller may retry.
func (s *Slot) Restore(l *lease.Hold) {
	s.mu.Lock()
	if s.hold == nil {
		s.hold = l
	}
	s.mu.Unlock()
}

// Put makes l the current hold. An older hold still there is reported lost
// to w: the key was free for l, so nobody unlocked the older one and it had
// expired or been deleted.
func (s *Slot) Put(l *lease.Hold, w *lease.Watchdog) {
	s.mu.Lock()
	old := s.hold
	s.hold = l
	s.mu.Unlock()
	if old != nil {
		w.Lose(&old.Lease, fmt.Errorf("%w: lease ran out before a new Lock on the handle", errs.ErrLost))
	}
}

// get is Get on a slot that may be nil.
func (s *Slot) get() *lease.Hold {
	if s == nil {
		return nil
	}
	return s.Get()
}

// inLiveCohort reports whether the current hold is in a cohort (see
// cohort.go) and still held: not lost, released or handed over.
func (s *Slot) inLiveCohort(wd *lease.Watchdog) bool {
	s.mu.Lock()
	l := s.hold
	s.mu.Unlock()
	return l != nil && l.Cohort.End > 0 && wd.IsHeld(&l.Lease)
}
