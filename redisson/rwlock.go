package redisson

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/errs"
)

const kindRW = "redisson.rwlock"

// ReadWriteLock is a handle on a Redisson RReadWriteLock: Java's
// getReadWriteLock(name), whose readLock() is RLock here and writeLock() is
// Lock, named after sync.RWMutex. The hash at name has a field mode ("read"
// or "write") and a field per holder with its count: <client id>:<thread
// id> for a reader, the same plus ":write" for the writer. Every read hold
// also has its own key, <{name}>:<reader field>:rwlock_timeout:<n>, with the
// hold's lease, which Java's read unlock reads to decide how long the lock
// lives on; Go writes and renews them exactly so.
//
// Holds are reentrant per owner (dlock.WithOwner). A writer may take read
// holds too (and keeps them after its write Unlock: a downgrade); a reader
// may not take the write lock (no upgrade: it waits for itself, as in
// Java, until ctx ends).
type ReadWriteLock struct {
	c     *Client
	name  string
	lease time.Duration
	err   error
}

// ReadWriteLock returns the handle of the RReadWriteLock called name.
func (c *Client) ReadWriteLock(name string) *ReadWriteLock {
	return &ReadWriteLock{c: c, name: name}
}

// Name returns the lock's name.
func (rw *ReadWriteLock) Name() string { return rw.name }

// WithLease returns a handle whose read and write acquisitions take a fixed
// lease, unrenewed; a lease under a millisecond makes every call fail with
// dlock.ErrInvalid.
func (rw *ReadWriteLock) WithLease(lease time.Duration) *ReadWriteLock {
	n := *rw
	n.lease = lease
	if lease < time.Millisecond {
		n.err = errs.Invalidf("lease %v under 1ms", lease)
	}
	return &n
}

func (rw *ReadWriteLock) begin(ctx context.Context, op string, kind holdKind) (holdKey, error) {
	if err := rw.c.check(op, rw.name); err != nil {
		return holdKey{}, err
	}
	if rw.err != nil {
		return holdKey{}, errs.Op(op, rw.name, "", rw.err)
	}
	f, err := rw.c.field(op, rw.name, ctx)
	if kind == kindWrite {
		f += ":write"
	}
	return holdKey{kind: kind, name: rw.name, field: f}, err
}

// tryOnce runs one read or write acquisition.
func (rw *ReadWriteLock) tryOnce(ctx context.Context, op string, key holdKey) (bool, time.Duration, error) {
	lease, renew := rw.c.leaseOf(rw.lease)
	sent := time.Now()
	var err error
	var ttl int64
	if key.kind == kindRead {
		ttl, err = scriptRWTryRead.Run(ctx, rw.c.rdb, []string{rw.name, rwTimeoutPrefix(rw.name, key.field)},
			ms(lease), key.field, key.field+":write").Int64()
	} else {
		ttl, err = scriptRWTryWrite.Run(ctx, rw.c.rdb, []string{rw.name}, ms(lease), key.field).Int64()
	}
	if errors.Is(err, redis.Nil) {
		rw.c.acquired(key, lease, renew, sent, 0)
		return true, 0, nil
	}
	if err != nil {
		return false, 0, redisErr(op, rw.name, kindRW, err)
	}
	return false, time.Duration(ttl) * time.Millisecond, nil
}

func (rw *ReadWriteLock) lock(ctx context.Context, op, span string, kind holdKind) (err error) {
	key, err := rw.begin(ctx, op, kind)
	ctx, sp := rw.c.tel.Start(ctx, kindRW, span, rw.name, rw.lease)
	defer func() { sp.EndAcquire(err, err == nil, true) }()
	if err != nil {
		return err
	}
	return rw.c.await(ctx, op, rw.name, rwChannel(rw.name), rw.c.cfg.watchdog, func(ctx context.Context) (bool, time.Duration, error) {
		return rw.tryOnce(ctx, op, key)
	})
}

func (rw *ReadWriteLock) try(ctx context.Context, op, span string, kind holdKind) (ok bool, err error) {
	key, err := rw.begin(ctx, op, kind)
	ctx, sp := rw.c.tel.Start(ctx, kindRW, span, rw.name, rw.lease)
	defer func() { sp.EndAcquire(err, ok, false) }()
	if err != nil {
		return false, err
	}
	ok, _, err = rw.tryOnce(context.WithoutCancel(ctx), op, key)
	return ok, err
}

// Lock blocks until the owner in ctx holds the write lock, ctx ends
// (dlock.ErrNotObtained and ctx.Err()) or the Client closes, waiting as
// (*Lock).Lock does on redisson_rwlock:{name}. A write re-entry adds its
// lease to what the lock had left, as Java's does.
func (rw *ReadWriteLock) Lock(ctx context.Context) error {
	return rw.lock(ctx, "lock", "redisson.ReadWriteLock.Lock", kindWrite)
}

// TryLock takes or re-enters the write lock if it can at once, in one round
// trip.
func (rw *ReadWriteLock) TryLock(ctx context.Context) (bool, error) {
	return rw.try(ctx, "trylock", "redisson.ReadWriteLock.TryLock", kindWrite)
}

// RLock blocks until the owner in ctx holds a read hold: at once while the
// lock is free, read-locked, or write-locked by the same owner.
func (rw *ReadWriteLock) RLock(ctx context.Context) error {
	return rw.lock(ctx, "rlock", "redisson.ReadWriteLock.RLock", kindRead)
}

// TryRLock takes a read hold if it can at once, in one round trip.
func (rw *ReadWriteLock) TryRLock(ctx context.Context) (bool, error) {
	return rw.try(ctx, "tryrlock", "redisson.ReadWriteLock.TryRLock", kindRead)
}

// Unlock undoes one write hold of the owner in ctx. The last one frees the
// lock and publishes 1 (wake every waiter), or, when the owner still has
// read holds, leaves the lock in read mode without a message, as Java does.
// It returns an error matching dlock.ErrNotHeld when the owner holds no
// write hold.
func (rw *ReadWriteLock) Unlock(ctx context.Context) (err error) {
	key, err := rw.begin(ctx, "unlock", kindWrite)
	ctx, sp := rw.c.tel.Start(ctx, kindRW, "redisson.ReadWriteLock.Unlock", rw.name, 0)
	defer func() { sp.EndRelease(err) }()
	if err != nil {
		return err
	}
	return rw.c.unlockOne(context.WithoutCancel(ctx), key, scriptRWUnlockWrite, rwChannel(rw.name))
}

// RUnlock undoes one read hold of the owner in ctx, deleting its hold key.
// When no other hold is left the lock is freed and 0 is published; else the
// lock lives as long as the longest read hold left, Go's or Java's. It
// returns an error matching dlock.ErrNotHeld when the owner has no read
// hold.
func (rw *ReadWriteLock) RUnlock(ctx context.Context) (err error) {
	key, err := rw.begin(ctx, "runlock", kindRead)
	ctx, sp := rw.c.tel.Start(ctx, kindRW, "redisson.ReadWriteLock.RUnlock", rw.name, 0)
	defer func() { sp.EndRelease(err) }()
	if err != nil {
		return err
	}
	ctx = context.WithoutCancel(ctx)
	pub, err := rw.c.publishCommand(ctx)
	if err != nil {
		return redisErr("runlock", rw.name, kindRW, err)
	}
	_, err = scriptRWUnlockRead.Run(ctx, rw.c.rdb,
		[]string{rw.name, rwChannel(rw.name), rwTimeoutPrefix(rw.name, key.field), keyPrefix(rw.name)},
		key.field, pub).Int64()
	if errors.Is(err, redis.Nil) {
		if h := rw.c.holdOf(key); h != nil {
			rw.c.lose(h, errs.Op("runlock", rw.name, "the read hold was gone from Redis", dlock.ErrLost))
			return errs.Op("runlock", rw.name, "", dlock.ErrLost, dlock.ErrNotHeld)
		}
		return errs.Op("runlock", rw.name, "", dlock.ErrNotHeld)
	}
	if err != nil {
		return redisErr("runlock", rw.name, kindRW, err)
	}
	rw.c.released(key, false)
	return nil
}

// ForceUnlock deletes the lock whoever holds it, publishing 1 when it was
// write-locked and 0 when read-locked (Java's forceUnlock of the write and
// read halves), and reports whether it was held. Read holds' keys are left
// to expire. This Client's holds of the lock are reported lost.
func (rw *ReadWriteLock) ForceUnlock(ctx context.Context) (bool, error) {
	if err := rw.c.check("forceunlock", rw.name); err != nil {
		return false, err
	}
	pub, err := rw.c.publishCommand(ctx)
	if err != nil {
		return false, redisErr("forceunlock", rw.name, kindRW, err)
	}
	n, err := scriptRWForce.Run(ctx, rw.c.rdb, []string{rw.name, rwChannel(rw.name)}, pub).Int64()
	if err != nil {
		return false, redisErr("forceunlock", rw.name, kindRW, err)
	}
	rw.c.loseName(rw.name, kindRead, kindWrite)
	return n == 1, nil
}

// Mode returns "read" or "write" while the lock is held, "" while it is
// free, in one round trip. In write mode the writer may hold read holds
// too.
func (rw *ReadWriteLock) Mode(ctx context.Context) (string, error) {
	if err := rw.c.check("mode", rw.name); err != nil {
		return "", err
	}
	m, err := rw.c.rdb.HGet(ctx, rw.name, "mode").Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", redisErr("mode", rw.name, kindRW, err)
	}
	return m, nil
}

// Lost returns a channel closed if the write hold of the owner in ctx is
// lost, as (*Lock).Lost; nil without one.
func (rw *ReadWriteLock) Lost(ctx context.Context) <-chan struct{} {
	key, err := rw.begin(ctx, "lost", kindWrite)
	if err != nil {
		return nil
	}
	return rw.c.lostOf(key)
}

// RLost returns a channel closed if the read holds of the owner in ctx are
// lost; nil without any.
func (rw *ReadWriteLock) RLost(ctx context.Context) <-chan struct{} {
	key, err := rw.begin(ctx, "rlost", kindRead)
	if err != nil {
		return nil
	}
	return rw.c.lostOf(key)
}
