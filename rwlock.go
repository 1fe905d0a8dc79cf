package dlock

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/engine"
	"github.com/dlock-go/dlock/internal/lease"
	"github.com/dlock-go/dlock/internal/scripts"
	"github.com/dlock-go/dlock/internal/telemetry"
	"github.com/dlock-go/dlock/internal/wait"
	"github.com/dlock-go/dlock/internal/wire"
)

// RWMutex is a distributed reader/writer lock: many readers or one writer,
// across processes. Both sides are reentrant per owner, with the owner model
// of ReentrantMutex: the owner in the context (WithOwner), or the handle for
// a handle made WithHandleOwner; a call with neither fails with ErrInvalid.
//
// It is fair to both sides, as sync.RWMutex is: once a writer waits, new
// readers queue behind it, so a stream of readers cannot starve a writer;
// when a writer releases, every reader queued gets the lock at once, before
// the next writer, so a stream of writers cannot starve readers either. The
// waiters queue in Redis, across Clients, and a release hands the lock
// straight to those it lets in. An owner that already reads may still
// re-enter its read hold while a writer waits, since making it wait for a
// writer that waits for it would deadlock. A writer may also take the read
// lock (downgrade: Lock, RLock, Unlock leaves a read hold). A reader asking
// for the write lock gets ErrUpgrade at once instead of deadlocking.
//
// Each owner's read hold has its own lease, renewed by the watchdog, so a
// crashed reader holds writers back only until its lease runs out. Each
// write hold has a fencing token (see Token).
//
// Make one with Client.RWMutex. The zero RWMutex is not usable.
type RWMutex struct {
	h    *engine.Handle    // keys: W, RL, RC, Q, QE, F (see internal/scripts/rw_common.lua) and the channel
	r    *engine.Handle    // h as the read side reports itself in telemetry
	w    *engine.Reentrant // the write side: a ReentrantMutex's engine over the rw_*.lua scripts
	self string            // owner ID used when ctx names none (WithHandleOwner); else ""
}

// RWMutex returns a handle on the read-write lock called name. It sends
// nothing to Redis. An empty name or an invalid option makes every method
// return an error wrapping ErrInvalid.
//
// Its writers cohort as a ReentrantMutex's owners do (WithCohort,
// WithoutCohort): an owner's last Unlock hands the write hold to a writer
// of the same Client waiting for it, without a round trip, within the
// cohort's bounds, unless either owner holds a read lock on it. Readers
// queued meanwhile, on any Client, get the lock when the cohort releases
// it to Redis, before the next writer, as after any writer.
func (c *Client) RWMutex(name string, opts ...LockOption) *RWMutex {
	lc := buildLockConfig(opts)
	h := c.core.NewHandle(telemetry.KindRWWrite, name, lc.lease, lc.renewed, lc.err, engine.RWKeys...)
	r := *h
	r.Kind = telemetry.KindRWRead
	return &RWMutex{h: h, r: &r, w: engine.NewRWWrite(h, lc.cohort), self: handleOwnerID(c, lc)}
}

// Name returns the lock's name, without the key prefix.
func (rw *RWMutex) Name() string { return rw.h.Name }

// owner returns the owner of a call with ctx.
func (rw *RWMutex) owner(ctx context.Context) (string, error) {
	if err := rw.h.Usable(ctx); err != nil {
		return "", err
	}
	return ownerID(rw.h.C, ctx, rw.self)
}

// reader returns the owner in ctx's read side of the lock. Both sides of
// one owner share its gate (the write side's: see engine's Reentrant).
func (rw *RWMutex) reader(ctx context.Context) (*engine.Counted, error) {
	owner, err := rw.owner(ctx)
	if err != nil {
		return nil, err
	}
	// A read hold keeps RC and W (the lock's kind) alive with it.
	k := &engine.Counted{H: rw.r, Ops: rwReadOps{rw}, Owner: owner, Gate: engine.HoldKey(rw.h.Key, owner),
		LeaseKey: rw.h.Keys[1], Extra: []string{rw.h.Keys[2], rw.h.Keys[0]}, Spec: wire.SpecMemberWith2,
		Waiter: wire.RWReader(rw.h.Lease, owner), MarkKey: rw.h.Keys[4], MarkExtra: rw.h.Keys[3:4]}
	k.MarkSpec = wire.Spec{Kind: wire.SpecMemberWith, ID: k.Waiter}
	k.HK = engine.HoldKey(k.LeaseKey, owner)
	return k, nil
}

// acquire runs one acquiring call on a side of the lock.
func (rw *RWMutex) acquire(ctx context.Context, write bool, op string, block bool) (bool, error) {
	if write {
		owner, err := rw.owner(ctx)
		if err != nil {
			return false, err
		}
		return rw.w.Acquire(ctx, owner, op, block)
	}
	k, err := rw.reader(ctx)
	if err != nil {
		return false, err
	}
	// A reader is handed the lock unclaimed and claims it with a try.
	return k.NewAcquisition(ctx, op, block, wait.As{Kind: wire.KindReader, Owner: k.Owner}).Run()
}

// release drops one hold of a side of the lock.
func (rw *RWMutex) release(ctx context.Context, write bool, op string) error {
	if write {
		owner, err := rw.owner(ctx)
		if err != nil {
			return err
		}
		return rw.w.Release(ctx, owner, op)
	}
	k, err := rw.reader(ctx)
	if err != nil {
		return err
	}
	return k.Release(ctx, op)
}

// RLock blocks until the owner holds a read lock, ctx ends, or the Client
// closes. When ctx ends first it returns an error matching both
// ErrNotObtained and ctx.Err(), and changes nothing.
func (rw *RWMutex) RLock(ctx context.Context) (err error) {
	ctx, sp, err := rw.r.BeginAcquire(ctx, "dlock.RWMutex.RLock", "rlock")
	defer func() { sp.EndAcquire(err, err == nil, true) }()
	if err == nil {
		_, err = rw.acquire(ctx, false, "rlock", true)
	}
	return err
}

// TryRLock takes or re-enters a read hold if no other owner writes and no
// writer waits, and reports whether it did, in one round trip.
func (rw *RWMutex) TryRLock(ctx context.Context) (ok bool, err error) {
	ctx, sp, err := rw.r.BeginAcquire(ctx, "dlock.RWMutex.TryRLock", "tryrlock")
	defer func() { sp.EndAcquire(err, ok, false) }()
	if err == nil {
		ok, err = rw.acquire(ctx, false, "tryrlock", false)
	}
	return ok, err
}

// Lock blocks until the owner holds the write lock, ctx ends, or the Client
// closes. While it waits, new readers queue behind it. It returns an error
// matching ErrUpgrade at once if the owner holds a read lock and not the
// write lock. When ctx ends first it returns an error matching both
// ErrNotObtained and ctx.Err(), withdraws its wait, and changes nothing.
func (rw *RWMutex) Lock(ctx context.Context) (err error) {
	ctx, sp, err := rw.h.BeginAcquire(ctx, "dlock.RWMutex.Lock", "lock")
	defer func() { sp.EndAcquire(err, err == nil, true) }()
	if err == nil {
		_, err = rw.acquire(ctx, true, "lock", true)
	}
	return err
}

// TryLock takes or re-enters the write lock if nobody else holds the lock,
// and reports whether it did, in one round trip. It leaves no waiting mark.
func (rw *RWMutex) TryLock(ctx context.Context) (ok bool, err error) {
	ctx, sp, err := rw.h.BeginAcquire(ctx, "dlock.RWMutex.TryLock", "trylock")
	defer func() { sp.EndAcquire(err, ok, false) }()
	if err == nil {
		ok, err = rw.acquire(ctx, true, "trylock", false)
	}
	return ok, err
}

// RUnlock drops one of the owner's read holds; the last reader out wakes one
// waiting writer (or everyone, if none waits). It returns an error matching
// ErrNotHeld when the owner reads nothing, or ErrLost when its read hold was
// lost. Like Mutex.Unlock, it runs even when ctx has ended, and when it
// fails the read hold is no longer renewed: it ends by its lease at the
// latest.
func (rw *RWMutex) RUnlock(ctx context.Context) (err error) {
	ctx, sp, err := rw.r.Begin(ctx, "dlock.RWMutex.RUnlock")
	defer func() { sp.EndRelease(err) }()
	if err == nil {
		err = rw.release(ctx, false, "runlock")
	}
	return err
}

// Unlock drops one of the owner's write holds; the last one releases the
// write lock and wakes whoever can proceed: one waiting writer, else all
// readers. It returns an error matching ErrNotHeld when the owner does not
// write, or ErrLost when its write hold was lost. Like Mutex.Unlock, it runs
// even when ctx has ended, and when it fails the write hold is no longer
// renewed: it ends by its lease at the latest.
func (rw *RWMutex) Unlock(ctx context.Context) (err error) {
	ctx, sp, err := rw.h.Begin(ctx, "dlock.RWMutex.Unlock")
	defer func() { sp.EndRelease(err) }()
	if err == nil {
		err = rw.release(ctx, true, "unlock")
	}
	return err
}

// Lost returns a channel that is closed if the write hold of the owner in
// ctx is lost, or nil when that owner does not write through this Client.
func (rw *RWMutex) Lost(ctx context.Context) <-chan struct{} {
	return rw.h.C.WD.LostOf(rw.holdOf(ctx, true))
}

// RLost is Lost for the owner's read hold.
func (rw *RWMutex) RLost(ctx context.Context) <-chan struct{} {
	return rw.h.C.WD.LostOf(rw.holdOf(ctx, false))
}

// HoldContext returns a copy of ctx cancelled when the write hold of the
// owner in ctx ends (see Mutex.HoldContext).
func (rw *RWMutex) HoldContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return rw.h.C.WD.HoldContext(ctx, rw.holdOf(ctx, true))
}

// RHoldContext is HoldContext for the owner's read hold.
func (rw *RWMutex) RHoldContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return rw.h.C.WD.HoldContext(ctx, rw.holdOf(ctx, false))
}

func (rw *RWMutex) holdOf(ctx context.Context, write bool) *lease.Hold {
	if write {
		owner, err := rw.owner(ctx)
		if err != nil {
			return nil
		}
		return rw.w.Hold(owner)
	}
	k, err := rw.reader(ctx)
	if err != nil {
		return nil
	}
	return k.Hold()
}

// ForceUnlock releases the lock whoever holds it, the writer and every
// reader, and lets in whoever is queued, as a writer's Unlock would. It
// reports whether anyone held it. Holders on this Client learn at once,
// holders elsewhere at their next renewal (see ReentrantMutex.ForceUnlock).
func (rw *RWMutex) ForceUnlock(ctx context.Context) (released bool, err error) {
	c := rw.h.C
	held := append(c.HoldsOn(rw.h.Keys[0]), c.HoldsOn(rw.h.Keys[1])...) // (see Core.HoldsOn)
	return rw.h.ForceUnlock(ctx, "dlock.RWMutex.ForceUnlock", func(ctx context.Context) ([]any, error) {
		return c.Script(ctx, scripts.RWForce, rw.h.Keys, c.ID).Slice()
	}, func(cause error) { c.LoseHolds(held, cause) })
}

// Extend makes the write hold of the owner in ctx end lease from now (see
// Mutex.Extend).
func (rw *RWMutex) Extend(ctx context.Context, lease time.Duration) error {
	return rw.h.Extend(ctx, "dlock.RWMutex.Extend", rw.holdOf(ctx, true), lease)
}

// RExtend is Extend for the owner's read hold.
func (rw *RWMutex) RExtend(ctx context.Context, lease time.Duration) error {
	return rw.r.Extend(ctx, "dlock.RWMutex.RExtend", rw.holdOf(ctx, false), lease)
}

// Token returns the fencing token of the write hold of the owner in ctx, or
// 0 when that owner does not write through this Client, and when ctx names
// no owner and the handle was not made WithHandleOwner. A write hold's
// token stays the same through its re-entries; read holds have none.
func (rw *RWMutex) Token(ctx context.Context) uint64 {
	if l := rw.holdOf(ctx, true); l != nil {
		return l.Token
	}
	return 0
}

// rwReadOps are the read side's scripts (see engine's CountedOps).
type rwReadOps struct{ rw *RWMutex }

func (o rwReadOps) TryScript(ctx context.Context, owner, waiter string, ttl, markTTL time.Duration, _ int64) (wire.Try, error) {
	rw := o.rw
	// The owner's write grant, if it writes: the writer may read
	// (rw_try_read.lua). The owner's gate is held, so it cannot change.
	var grant string
	if l := rw.w.Hold(owner); l != nil && rw.h.C.WD.IsHeld(&l.Lease) {
		grant = l.Spec.ID
	}
	res, err := rw.h.C.Script(ctx, scripts.RWTryRead, rw.h.Keys, waiter, wire.Millis(ttl), wire.Millis(markTTL), rw.h.C.ID, grant).Slice()
	if err != nil {
		return wire.Try{}, err
	}
	return wire.DecodeTry(res)
}

func (o rwReadOps) ServerCount(ctx context.Context, owner string) (int64, error) {
	return o.rw.h.C.RDB.HGet(ctx, o.rw.h.Keys[2], owner).Int64()
}

func (o rwReadOps) ReleaseScript(ctx context.Context, owner string) (int64, error) {
	return o.rw.run(ctx, scripts.RWUnlockRead, owner, o.rw.h.C.ID)
}

func (o rwReadOps) LeaveQueue(ctx context.Context, _, waiter string, _ int64) {
	// (rw_cancel.lua takes what excl_cancel.lua does.)
	_, _ = o.rw.run(ctx, scripts.RWCancel, telemetry.KindRWRead, waiter, o.rw.h.C.ID, "0", 0)
}

// run runs a script of the read side that releases or leaves, and wakes
// the waiters of this Client it let in.
func (rw *RWMutex) run(ctx context.Context, s *redis.Script, args ...any) (int64, error) {
	res, err := rw.h.C.Script(ctx, s, rw.h.Keys, args...).Slice()
	if err != nil {
		rw.h.WakeUnknown(err)
		return 0, err
	}
	return rw.h.SettleHandover(res)
}
