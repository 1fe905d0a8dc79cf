package redisson

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/errs"
)

const kindName = "redisson.lock"

// Lock is a handle on a Redisson RLock: the reentrant exclusive lock Java
// code takes with redisson.getLock(name). Go and Java holders of one name
// exclude each other, wake each other through Redisson's unlock message and
// renew their holds the same way.
//
// A hold belongs to an owner, the string dlock.WithOwner or
// dlock.WithNewOwner put in the context: Lock and TryLock with the same
// owner re-enter (each needs its Unlock), different owners exclude each
// other. The holder field in Redis is <client id>:<thread id>, the thread
// id derived from the owner (see docs/redisson.md, "Using it from Go").
// Calls without an owner fail with dlock.ErrInvalid.
//
// A Lock is safe for concurrent use; handles are cheap, and two handles of
// one name on one Client are interchangeable.
type Lock struct {
	c      *Client
	name   string
	lease  time.Duration // 0: the watchdog
	err    error         // an invalid WithLease
	fenced bool
}

// Lock returns the handle of the RLock called name, the raw key Redisson
// uses (no prefix is added; apply the Java side's NameMapper, if any). An
// empty name makes every call fail with dlock.ErrInvalid.
func (c *Client) Lock(name string) *Lock { return &Lock{c: c, name: name} }

// Name returns the lock's name.
func (l *Lock) Name() string { return l.name }

// WithLease returns a handle on the same lock whose acquisitions take a
// fixed lease, as Java's lock(leaseTime, unit): the lock is not renewed and
// ends by itself once lease has passed. A lease under a millisecond makes
// every call of the returned handle fail with dlock.ErrInvalid. Without
// WithLease, holds last the watchdog timeout and are renewed every third of
// it until Unlock.
func (l *Lock) WithLease(lease time.Duration) *Lock {
	n := *l
	n.lease = lease
	if lease < time.Millisecond {
		n.err = errs.Invalidf("lease %v under 1ms", lease)
	}
	return &n
}

// begin checks a call's input and returns the holder field of ctx's owner.
func (l *Lock) begin(ctx context.Context, op string) (holdKey, error) {
	if err := l.c.check(op, l.name); err != nil {
		return holdKey{}, err
	}
	if l.err != nil {
		return holdKey{}, errs.Op(op, l.name, "", l.err)
	}
	f, err := l.c.field(op, l.name, ctx)
	return holdKey{kind: kindLock, name: l.name, field: f}, err
}

// leaseOf is the lease an acquisition sends, and whether the watchdog
// renews it.
func (c *Client) leaseOf(fixed time.Duration) (time.Duration, bool) {
	if fixed > 0 {
		return fixed, false
	}
	return c.cfg.watchdog, true
}

func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

// try runs one acquisition. It returns whether the lock was taken, else its
// PTTL, and the fenced token when fenced.
func (l *Lock) try(ctx context.Context, op string, key holdKey) (bool, time.Duration, int64, error) {
	lease, renew := l.c.leaseOf(l.lease)
	keys := []string{l.name}
	if l.fenced {
		keys = append(keys, tokenKey(l.name))
	}
	sent := time.Now()
	v, err := scriptLockTry.Run(ctx, l.c.rdb, keys, ms(lease), key.field).Result()
	if errors.Is(err, redis.Nil) && !l.fenced {
		l.c.acquired(key, lease, renew, sent, 0)
		return true, 0, 0, nil
	}
	if err != nil {
		return false, 0, 0, redisErr(op, l.name, kindName, err)
	}
	switch v := v.(type) {
	case int64:
		if !l.fenced {
			return false, time.Duration(v) * time.Millisecond, 0, nil
		}
	case []any:
		if len(v) == 2 {
			taken, _ := v[0].(int64)
			n, _ := v[1].(int64)
			if taken == 1 {
				l.c.acquired(key, lease, renew, sent, n)
				return true, 0, n, nil
			}
			return false, time.Duration(n) * time.Millisecond, 0, nil
		}
	}
	return false, 0, 0, errs.Op(op, l.name, "unexpected reply from the acquire script", dlock.ErrUnavailable)
}

// Lock blocks until the owner in ctx holds the lock (taking it, or
// re-entering its own hold), ctx ends, or the Client closes.
//
// It waits as Redisson does: it tries, subscribes to
// redisson_lock__channel:{name}, tries again, then retries on every unlock
// message and whenever the holder's lease (the PTTL its last try saw) runs
// out, without polling. When ctx ends first it returns an error matching
// dlock.ErrNotObtained and ctx.Err(), and holds nothing it did not hold
// before. A key at name that is not a Redisson lock (another type, a dlock
// lock, a read-write lock) fails with dlock.ErrInvalid and is left as it
// was. Uncontended, Lock is one round trip.
func (l *Lock) Lock(ctx context.Context) (err error) {
	_, err = l.lock(ctx, "lock", "redisson.Lock.Lock")
	return err
}

func (l *Lock) lock(ctx context.Context, op, span string) (token int64, err error) {
	key, err := l.begin(ctx, op)
	ctx, sp := l.c.tel.Start(ctx, kindName, span, l.name, l.lease)
	defer func() { sp.EndAcquire(err, err == nil, true) }()
	if err != nil {
		return 0, err
	}
	err = l.c.await(ctx, op, l.name, lockChannel(l.name), l.c.cfg.watchdog, func(ctx context.Context) (bool, time.Duration, error) {
		ok, ttl, t, err := l.try(ctx, op, key)
		token = t
		return ok, ttl, err
	})
	return token, err
}

// TryLock takes the lock for the owner in ctx, or re-enters its hold, if
// it can at once, and reports whether it did, in one round trip (Java's
// tryLock()). A lock held by another owner is (false, nil).
func (l *Lock) TryLock(ctx context.Context) (ok bool, err error) {
	ok, _, err = l.tryLock(ctx, "trylock", "redisson.Lock.TryLock")
	return ok, err
}

func (l *Lock) tryLock(ctx context.Context, op, span string) (ok bool, token int64, err error) {
	key, err := l.begin(ctx, op)
	ctx, sp := l.c.tel.Start(ctx, kindName, span, l.name, l.lease)
	defer func() { sp.EndAcquire(err, ok, false) }()
	if err != nil {
		return false, 0, err
	}
	ok, _, token, err = l.try(context.WithoutCancel(ctx), op, key)
	return ok, token, err
}

// Unlock undoes one hold of the owner in ctx, in one round trip. The last
// one releases the lock and publishes Redisson's unlock message (0), which
// wakes Java and Go waiters; an inner one keeps the lock for the lease its
// hold was taken with, as Java does.
//
// It returns an error matching dlock.ErrNotHeld when the owner holds
// nothing (Java's IllegalMonitorStateException), and then changes nothing in
// Redis; when this Client still counted a hold that Redis no longer has
// (it expired or was forced), the error matches dlock.ErrLost too and the
// hold is reported lost. Unlock sends its request even when ctx has ended.
// When Redis cannot be asked, or its reply is lost, the error says so and
// the Client keeps its record of the hold: the watchdog goes on renewing
// it, and reports it lost if the unlock did apply.
func (l *Lock) Unlock(ctx context.Context) (err error) {
	key, err := l.begin(ctx, "unlock")
	ctx, sp := l.c.tel.Start(ctx, kindName, "redisson.Lock.Unlock", l.name, 0)
	defer func() { sp.EndRelease(err) }()
	if err != nil {
		return err
	}
	return l.c.unlockOne(context.WithoutCancel(ctx), key, scriptLockUnlock, lockChannel(l.name))
}

// unlockOne runs an unlock script of the lock or write-lock shape and
// records its outcome.
func (c *Client) unlockOne(ctx context.Context, key holdKey, script *redis.Script, channel string) error {
	op := "unlock"
	pub, err := c.publishCommand(ctx)
	if err != nil {
		return redisErr(op, key.name, kindName, err)
	}
	lease := c.cfg.watchdog
	h := c.holdOf(key)
	if h != nil {
		c.mu.Lock()
		lease = h.lease
		c.mu.Unlock()
	}
	n, err := script.Run(ctx, c.rdb, []string{key.name, channel}, ms(lease), key.field, pub).Int64()
	switch {
	case errors.Is(err, redis.Nil):
		if h != nil {
			c.lose(h, errs.Op(op, key.name, "the hold was gone from Redis", dlock.ErrLost))
			return errs.Op(op, key.name, "", dlock.ErrLost, dlock.ErrNotHeld)
		}
		return errs.Op(op, key.name, "", dlock.ErrNotHeld)
	case err != nil:
		return redisErr(op, key.name, kindName, err)
	}
	c.released(key, n == 1)
	return nil
}

// ForceUnlock deletes the lock whoever holds it and publishes the unlock
// message, as Java's forceUnlock; it reports whether there was a hold. This
// Client's holds of the lock are reported lost at once; holders elsewhere
// learn it at their next renewal (Go) or unlock (Java). A key that is not a
// Redisson lock is left as it is, with an error matching dlock.ErrInvalid.
func (l *Lock) ForceUnlock(ctx context.Context) (released bool, err error) {
	if err := l.c.check("forceunlock", l.name); err != nil {
		return false, err
	}
	pub, err := l.c.publishCommand(ctx)
	if err != nil {
		return false, redisErr("forceunlock", l.name, kindName, err)
	}
	n, err := scriptLockForce.Run(ctx, l.c.rdb, []string{l.name, lockChannel(l.name)}, pub).Int64()
	if err != nil {
		return false, redisErr("forceunlock", l.name, kindName, err)
	}
	l.c.loseName(l.name, kindLock)
	return n == 1, nil
}

// IsLocked reports whether anyone holds the lock (EXISTS, as Java's
// isLocked), in one round trip.
func (l *Lock) IsLocked(ctx context.Context) (bool, error) {
	if err := l.c.check("islocked", l.name); err != nil {
		return false, err
	}
	n, err := l.c.rdb.Exists(ctx, l.name).Result()
	if err != nil {
		return false, redisErr("islocked", l.name, kindName, err)
	}
	return n == 1, nil
}

// HoldCount returns how many holds the owner in ctx has on the lock (Java's
// getHoldCount), 0 when none, in one round trip.
func (l *Lock) HoldCount(ctx context.Context) (int, error) {
	key, err := l.begin(ctx, "holdcount")
	if err != nil {
		return 0, err
	}
	n, err := l.c.rdb.HGet(ctx, l.name, key.field).Int()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, redisErr("holdcount", l.name, kindName, err)
	}
	return n, nil
}

// TTL returns how long the lock's current lease has left, whoever holds
// it, or 0 when it is free (Java's remainTimeToLive).
func (l *Lock) TTL(ctx context.Context) (time.Duration, error) {
	if err := l.c.check("ttl", l.name); err != nil {
		return 0, err
	}
	d, err := l.c.rdb.PTTL(ctx, l.name).Result()
	if err != nil {
		return 0, redisErr("ttl", l.name, kindName, err)
	}
	return max(d, 0), nil
}

// Extend sets the lease of the owner's hold to lease from now, whether that
// is sooner or later, in one round trip; from then on the watchdog no
// longer renews it. It returns an error matching dlock.ErrNotHeld when the
// owner holds nothing this Client knows of (a hold reported lost is not
// extended), and one matching dlock.ErrLost too when the hold turns out to
// be gone from Redis. A lease under a millisecond is dlock.ErrInvalid.
func (l *Lock) Extend(ctx context.Context, lease time.Duration) error {
	key, err := l.begin(ctx, "extend")
	if err != nil {
		return err
	}
	return l.c.extend(ctx, key, lease)
}

func (c *Client) extend(ctx context.Context, key holdKey, lease time.Duration) error {
	if lease < time.Millisecond {
		return errs.Op("extend", key.name, "", errs.Invalidf("lease %v under 1ms", lease))
	}
	// Only a hold this Client knows is extended: one it reported lost stays
	// lost, even if its key has not quite expired in Redis yet.
	h := c.holdOf(key)
	if h == nil {
		return errs.Op("extend", key.name, "", dlock.ErrNotHeld)
	}
	sent := time.Now()
	n, err := scriptLockExtend.Run(ctx, c.rdb, []string{key.name}, ms(lease), key.field).Int64()
	if err != nil {
		return redisErr("extend", key.name, kindName, err)
	}
	if n == 0 {
		c.lose(h, errs.Op("extend", key.name, "the hold was gone from Redis", dlock.ErrLost))
		return errs.Op("extend", key.name, "", dlock.ErrLost, dlock.ErrNotHeld)
	}
	c.mu.Lock()
	if !h.ended {
		h.renew, h.lease, h.deadline = false, lease, sent.Add(lease)
		c.armLocked(h)
	}
	c.mu.Unlock()
	return nil
}

// Lost returns a channel closed if the current hold of the owner in ctx is
// lost: its field vanished from Redis (a force unlock, an expiry), renewals
// failed for a whole lease, its fixed lease ran out, or the Client closed.
// Unlock does not close it. Without a hold (or an owner) it returns nil, a
// channel that never fires.
func (l *Lock) Lost(ctx context.Context) <-chan struct{} {
	key, err := l.begin(ctx, "lost")
	if err != nil {
		return nil
	}
	return l.c.lostOf(key)
}

// HoldContext returns a copy of parent cancelled when the current hold of
// the owner in parent ends: by its last Unlock, or by loss, and then
// context.Cause matches dlock.ErrLost. Without a hold it is cancelled
// already, with a cause matching dlock.ErrNotHeld. Call the CancelFunc when
// done.
func (l *Lock) HoldContext(parent context.Context) (context.Context, context.CancelFunc) {
	key, err := l.begin(parent, "holdcontext")
	if err != nil {
		ctx, cancel := context.WithCancelCause(parent)
		cancel(err)
		return ctx, func() { cancel(context.Canceled) }
	}
	return l.c.holdContext(parent, key)
}
