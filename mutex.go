package dlock

import (
	"context"
	"time"

	"github.com/dlock-go/dlock/internal/engine"
	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/telemetry"
)

// Mutex is a distributed mutual exclusion lock that behaves like sync.Mutex:
// it is not reentrant, and one handle may be shared by many goroutines, which
// then exclude each other just as goroutines on other handles and in other
// processes do. As with sync.Mutex, the hold belongs to the handle, not to a
// goroutine: any goroutine may Unlock what another locked.
//
// Each acquisition stores a fresh random ID in the lock's key, and Unlock
// releases the lock only if it still holds that ID, so a hold that expired
// can never release someone else's newer hold. Each acquisition also gets a
// fencing token (see Token).
//
// Make one with Client.Mutex. The zero Mutex is not usable.
type Mutex struct {
	h    *engine.Handle
	slot *engine.Slot // the current hold
	lk   engine.Lock  // one Redis (engine.Mutex) or a Redlock's masters (redlock.Mutex)
}

// Mutex returns a handle on the plain lock called name. It sends nothing to
// Redis. An empty name or an invalid option makes every method return an
// error wrapping ErrInvalid.
func (c *Client) Mutex(name string, opts ...LockOption) *Mutex {
	return c.newMutex(telemetry.KindMutex, name, opts)
}

// newMutex makes a Mutex whose keys hold the given kind: a plain Mutex, or
// the lock under an Election.
func (c *Client) newMutex(kind, name string, opts []LockOption) *Mutex {
	lc := buildLockConfig(opts)
	h := c.core.NewHandle(kind, name, lc.lease, lc.renewed, lc.err, engine.ExclKeys...)
	slot := &engine.Slot{}
	return &Mutex{h: h, slot: slot, lk: engine.NewMutex(h, slot, lc.cohort)}
}

// Name returns the lock's name, without the key prefix.
func (m *Mutex) Name() string { return m.h.Name }

// Lock blocks until it holds the lock, ctx ends, or the Client closes.
//
// When ctx ends first it returns an error matching both ErrNotObtained and
// ctx.Err(), and leaves nothing held: a grant that raced the end of ctx is
// passed on. Uncontended, Lock is one round trip to Redis. A blocked Lock
// joins the lock's queue in Redis and waits, without polling, for a release
// to hand it the lock: waiters are served in arrival order, whichever Client
// they wait on, and a handed-over lock needs no further round trip. A Lock
// called while a goroutine of the same Client holds the lock may first be
// handed the hold in-process, within the cohort's bound (WithCohort;
// WithoutCohort turns this off).
func (m *Mutex) Lock(ctx context.Context) error { return m.lock(ctx, "dlock.Mutex.Lock", "lock") }

// lock is Lock for a call of op (its errors name op) recorded as spanName.
func (m *Mutex) lock(ctx context.Context, spanName, op string) (err error) {
	ctx, sp, err := m.h.BeginAcquire(ctx, spanName, op)
	defer func() { sp.EndAcquire(err, err == nil, true) }()
	if err != nil {
		return err
	}
	_, err = m.lk.Acquire(ctx, op, true)
	return err
}

// TryLock takes the lock if it is free and nobody is queued for it, and
// reports whether it did, in one round trip. A lock held elsewhere is
// (false, nil); an error means Redis could not be asked, or ctx had ended.
// As with sync.Mutex, correct uses of TryLock are rare: most callers want
// Lock with a deadline in ctx.
func (m *Mutex) TryLock(ctx context.Context) (ok bool, err error) {
	ctx, sp, err := m.h.BeginAcquire(ctx, "dlock.Mutex.TryLock", "trylock")
	defer func() { sp.EndAcquire(err, ok, false) }()
	if err != nil {
		return false, err
	}
	return m.lk.Acquire(ctx, "trylock", false)
}

// Unlock releases the handle's current hold, in one round trip. If callers
// are queued, the lock passes straight to the first of them.
//
// It returns an error matching ErrNotHeld when the handle holds nothing, and
// one matching ErrLost and ErrNotHeld when the hold was lost before Unlock:
// nothing else changes then, and when the hold was known to be lost before
// the call (its Lost channel had closed), nothing is sent to Redis. Unlock
// sends its request even when ctx has ended, since leaving a lock behind is
// worse than a late call; ctx still carries values such as trace spans.
//
// Lost may fire while the Unlock is on its way, when the hold's deadline
// passes before Redis answers (a slow link): if Redis then still had the
// hold and released it, Unlock returns nil, since nobody held the lock in
// between.
//
// When Unlock fails (Redis could not be reached, or its reply was lost), the
// hold may still be held on the server. It is no longer renewed, so it ends
// by its lease at the latest, and Lost fires then; the failure is logged.
// Calling Unlock again releases it sooner.
func (m *Mutex) Unlock(ctx context.Context) error {
	return m.unlock(ctx, "dlock.Mutex.Unlock", "unlock")
}

// unlock is Unlock for a call of op (its errors name op) recorded as
// spanName.
func (m *Mutex) unlock(ctx context.Context, spanName, op string) (err error) {
	ctx, sp, err := m.h.Begin(ctx, spanName)
	defer func() { sp.EndRelease(err) }()
	if err != nil {
		return err
	}
	l := m.slot.Take()
	if l == nil {
		return errs.Op(op, m.h.Name, "", ErrNotHeld)
	}
	if err := m.h.LostAlready(op, l); err != nil {
		return err
	}
	return m.lk.Release(ctx, l, op)
}

// Extend makes the handle's hold end lease from now (from when Redis runs
// the request), whether that is sooner or later than before, in one round
// trip. It works on holds the watchdog renews and on WithLease holds alike;
// from then on the watchdog no longer renews the hold, which ends by the
// new lease unless Extend is called again or Unlock comes first. The
// fencing token stays the same.
//
// It returns an error matching ErrNotHeld when the handle holds nothing,
// and ErrLost when the hold was lost (then nothing changes). When Redis
// cannot be reached the outcome is unknown, and the hold ends by the
// earlier of its old and new leases. A lease outside [MinLease, MaxLease]
// is ErrInvalid.
func (m *Mutex) Extend(ctx context.Context, lease time.Duration) error {
	return m.lk.Extend(ctx, "dlock.Mutex.Extend", m.slot.Get(), lease)
}

// Token returns the fencing token of the handle's current hold, or 0 when
// it holds nothing. Tokens are never 0 and strictly greater than every token
// issued earlier for the same name, across Clients, lease expiry and Redis
// restarts; pass it to what the lock protects, so that a guard there (see
// package fence) can refuse the writes of a holder that lost the lock.
func (m *Mutex) Token() uint64 {
	if l := m.slot.Get(); l != nil {
		return l.Token
	}
	return 0
}

// IsLocked reports whether anyone holds the lock, in one round trip.
func (m *Mutex) IsLocked(ctx context.Context) (bool, error) {
	st, err := m.lk.State(ctx, "islocked")
	return st.Holder != "", err
}

// TTL returns how long the current hold's lease has left, whoever holds it,
// or 0 when the lock is free. Under the watchdog it stays between two and
// three thirds of the watchdog timeout while held.
func (m *Mutex) TTL(ctx context.Context) (time.Duration, error) {
	st, err := m.lk.State(ctx, "ttl")
	return st.Left, err
}

// ForceUnlock releases the lock whoever holds it, and hands it to the first
// caller queued, if any, as an Unlock would. It reports whether there was a
// hold to release. This handle's own hold is reported lost at once; a holder
// elsewhere (another handle, another Client) learns of it, through Lost and
// its hold contexts, at its next renewal at the latest. When goroutines of
// the holder's Client wait for the lock, that Client hears the force's
// notice: a cohort's hold (the default) then learns at once, or at its
// Unlock, and is not handed on locally. It is for operators and tests: a
// holder that is still running loses its exclusion.
func (m *Mutex) ForceUnlock(ctx context.Context) (released bool, err error) {
	return m.lk.ForceUnlock(ctx, "dlock.Mutex.ForceUnlock")
}

// Lost returns a channel that is closed if the current hold is lost: its key
// vanished, renewals failed for a whole lease, its WithLease lease ran out,
// or the Client closed. Unlock does not close it. Lost returns nil (a channel
// that never fires) when the handle holds nothing.
func (m *Mutex) Lost() <-chan struct{} {
	return m.h.C.WD.LostOf(m.slot.Get())
}

// HoldContext returns a copy of parent that is cancelled when the current
// hold ends: by Unlock, or by loss, in which case context.Cause reports an
// error matching ErrLost. Work done under the lock should use it, so that it
// stops when exclusion can no longer be promised. Without a hold the context
// is already cancelled, with cause ErrNotHeld. On a loss it is cancelled
// before Lost closes. Call the CancelFunc when done.
func (m *Mutex) HoldContext(parent context.Context) (context.Context, context.CancelFunc) {
	return m.h.C.WD.HoldContext(parent, m.slot.Get())
}
