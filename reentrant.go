package dlock

import (
	"context"
	"time"

	"github.com/dlock-go/dlock/internal/engine"
	"github.com/dlock-go/dlock/internal/lease"
	"github.com/dlock-go/dlock/internal/telemetry"
)

// ReentrantMutex is a distributed lock that its owner may take again while
// holding it: the lock's key records the owner's ID and its hold count, and
// the owner must Unlock as many times as it locked.
//
// The owner is the one in the context (see WithOwner and WithNewOwner), so
// nested business logic that passes its context along re-enters, even
// through different handles of the same lock on the same Client, while
// different owners exclude each other. Owners are scoped to the Client.
//
// A call with no owner in its context fails with ErrInvalid: a handle kept
// in a struct field and shared by goroutines, as one keeps a sync.Mutex,
// must not let them all hold it at once. A handle made WithHandleOwner is
// instead itself the owner of such calls; share it only within one owner.
//
// Make one with Client.ReentrantMutex. The zero ReentrantMutex is not usable.
type ReentrantMutex struct {
	h    *engine.Handle
	lk   *engine.Reentrant
	x    *engine.Excl
	self string // owner ID used when ctx names none (WithHandleOwner); else ""
}

// ReentrantMutex returns a handle on the reentrant lock called name. It sends
// nothing to Redis. An empty name or an invalid option makes every method
// return an error wrapping ErrInvalid. A plain Mutex and a ReentrantMutex
// must not share a name: the second to lock gets an error saying the key is
// not a lock of its kind. It cohorts as a Mutex does (WithCohort): its last
// Unlock hands the lock to another owner's Lock waiting on this Client
// without a round trip, within the same bounds.
func (c *Client) ReentrantMutex(name string, opts ...LockOption) *ReentrantMutex {
	lc := buildLockConfig(opts)
	h := c.core.NewHandle(telemetry.KindReentrant, name, lc.lease, lc.renewed, lc.err, engine.ExclKeys...)
	lk := engine.NewReentrant(h, lc.cohort)
	return &ReentrantMutex{h: h, lk: lk, x: lk.Excl(), self: handleOwnerID(c, lc)}
}

// Name returns the lock's name, without the key prefix.
func (r *ReentrantMutex) Name() string { return r.h.Name }

// owner returns the owner ID of a call with ctx.
func (r *ReentrantMutex) owner(ctx context.Context) (string, error) {
	if err := r.h.Usable(ctx); err != nil {
		return "", err
	}
	return ownerID(r.h.C, ctx, r.self)
}

// Lock blocks until the owner holds the lock, ctx ends, or the Client closes.
// If the owner already holds it, Lock adds one hold and returns at once,
// keeping the first hold's lease (watchdog-renewed or fixed).
//
// When ctx ends first it returns an error matching both ErrNotObtained and
// ctx.Err(), and leaves the hold count as it was. Uncontended, Lock is one
// round trip.
func (r *ReentrantMutex) Lock(ctx context.Context) (err error) {
	ctx, sp, err := r.h.BeginAcquire(ctx, "dlock.ReentrantMutex.Lock", "lock")
	defer func() { sp.EndAcquire(err, err == nil, true) }()
	if err == nil {
		_, err = r.acquire(ctx, "lock", true)
	}
	return err
}

// TryLock takes or re-enters the lock if no other owner holds it, and
// reports whether it did, in one round trip. Another owner's hold is
// (false, nil).
func (r *ReentrantMutex) TryLock(ctx context.Context) (ok bool, err error) {
	ctx, sp, err := r.h.BeginAcquire(ctx, "dlock.ReentrantMutex.TryLock", "trylock")
	defer func() { sp.EndAcquire(err, ok, false) }()
	if err == nil {
		ok, err = r.acquire(ctx, "trylock", false)
	}
	return ok, err
}

func (r *ReentrantMutex) acquire(ctx context.Context, op string, block bool) (bool, error) {
	owner, err := r.owner(ctx)
	if err != nil {
		return false, err
	}
	return r.lk.Acquire(ctx, owner, op, block)
}

// Unlock drops one of the owner's holds; the last one releases the lock and
// wakes one waiter. One round trip.
//
// It returns an error matching ErrNotHeld when the owner holds nothing, and
// one matching ErrLost when the owner's hold had been lost; nothing else
// changes then. The owner's count, which this Client keeps, decides: an
// Unlock that leaves holds also drops Redis's count (what Status shows),
// and returns nil even if Redis could not be told. Like Mutex.Unlock, it
// runs even when ctx has ended, and when the last Unlock fails the hold is
// no longer renewed: it ends by its lease at the latest.
func (r *ReentrantMutex) Unlock(ctx context.Context) (err error) {
	ctx, sp, err := r.h.Begin(ctx, "dlock.ReentrantMutex.Unlock")
	defer func() { sp.EndRelease(err) }()
	var owner string
	if err == nil {
		owner, err = r.owner(ctx)
	}
	if err == nil {
		err = r.lk.Release(ctx, owner, "unlock")
	}
	return err
}

// HoldCount returns how many holds the owner in ctx has on the lock (0 when
// none, and when Redis names another holder). One round trip, which also
// checks that the lock is still the owner's in Redis.
func (r *ReentrantMutex) HoldCount(ctx context.Context) (int, error) {
	owner, err := r.owner(ctx)
	if err != nil {
		return 0, err
	}
	return r.lk.HoldCount(ctx, owner)
}

// IsLocked reports whether any owner holds the lock.
func (r *ReentrantMutex) IsLocked(ctx context.Context) (bool, error) {
	return r.x.IsLocked(ctx, "islocked")
}

// TTL returns how long the current hold's lease has left, whoever holds it,
// or 0 when the lock is free. Under the watchdog it stays between two and
// three thirds of the watchdog timeout while held.
func (r *ReentrantMutex) TTL(ctx context.Context) (time.Duration, error) { return r.x.TTL(ctx, "ttl") }

// ForceUnlock releases the lock whoever holds it, and hands it to the first
// waiter queued, if any. It reports whether there was a hold to release.
// Holders on other Clients learn of it, through Lost and their hold
// contexts, at their next renewal at the latest, and at once when
// goroutines of their Client wait for the lock (their subscription hears
// the force's notice); holders on this Client learn at once. It is for
// operators and tests: a holder that is still running loses its exclusion.
func (r *ReentrantMutex) ForceUnlock(ctx context.Context) (released bool, err error) {
	held := r.h.C.HoldsOn(r.h.Key) // (see Core.HoldsOn)
	return r.x.ForceUnlock(ctx, "dlock.ReentrantMutex.ForceUnlock", func(cause error) { r.h.C.LoseHolds(held, cause) })
}

// Extend makes the hold of the owner in ctx end lease from now, all its
// re-entries with it (see Mutex.Extend). It returns an error matching
// ErrNotHeld when that owner holds nothing through this Client.
func (r *ReentrantMutex) Extend(ctx context.Context, lease time.Duration) error {
	return r.h.Extend(ctx, "dlock.ReentrantMutex.Extend", r.holdOf(ctx), lease)
}

// Token returns the fencing token of the hold of the owner in ctx, or 0 when
// that owner holds nothing through this Client, and when ctx names no owner
// and the handle was not made WithHandleOwner (then Lock would fail with
// ErrInvalid too: 0 is never a valid token, so a fence guard refuses it).
// Re-entry keeps the owner's token; a new hold (after the last Unlock) gets
// a new one, greater than every token issued earlier for the name (see
// Mutex.Token).
func (r *ReentrantMutex) Token(ctx context.Context) uint64 {
	if l := r.holdOf(ctx); l != nil {
		return l.Token
	}
	return 0
}

// Lost returns a channel that is closed if the hold of the owner in ctx is
// lost (see Mutex.Lost), or nil when that owner holds nothing through this
// Client.
func (r *ReentrantMutex) Lost(ctx context.Context) <-chan struct{} {
	return r.h.C.WD.LostOf(r.holdOf(ctx))
}

// HoldContext returns a copy of ctx that is cancelled when the hold of the
// owner in ctx ends: by its last Unlock, or by loss, in which case
// context.Cause reports an error matching ErrLost. Without a hold it is
// already cancelled, with cause ErrNotHeld. Call the CancelFunc when done.
func (r *ReentrantMutex) HoldContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return r.h.C.WD.HoldContext(ctx, r.holdOf(ctx))
}

func (r *ReentrantMutex) holdOf(ctx context.Context) *lease.Hold {
	owner, err := r.owner(ctx)
	if err != nil {
		return nil
	}
	return r.lk.Hold(owner)
}
