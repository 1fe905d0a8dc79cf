package dlock

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/scripts"
)

// ReentrantMutex is a distributed lock that its owner may take again while
// holding it. The lock is a Redis hash mapping the owner's ID to its hold
// count; the owner must Unlock as many times as it locked.
//
// The owner is the one in the context (see WithOwner and WithNewOwner), so
// nested business logic that passes its context along re-enters, even
// through different handles of the same lock on the same Client. Without an
// owner in the context, the handle itself is the owner. Owners are scoped to
// the Client.
//
// Make one with Client.ReentrantMutex. The zero ReentrantMutex is not usable.
type ReentrantMutex struct {
	c       *Client
	name    string
	key     string
	channel string
	lc      lockConfig
	self    string // owner ID used when ctx names none
}

// ReentrantMutex returns a handle on the reentrant lock called name. It sends
// nothing to Redis. An empty name or an invalid option makes every method
// return an error wrapping ErrInvalid. A plain Mutex and a ReentrantMutex
// must not share a name: the second to lock gets an error saying the key is
// not a lock of its kind.
func (c *Client) ReentrantMutex(name string, opts ...LockOption) *ReentrantMutex {
	lc := buildLockConfig(opts)
	if lc.err == nil {
		lc.err = checkName(name)
	}
	key := lockKey(c.cfg.prefix, name)
	return &ReentrantMutex{c: c, name: name, key: key, channel: channelOf(key), lc: lc,
		self: c.id + ":h:" + rand.Text()}
}

// Name returns the lock's name, without the key prefix.
func (r *ReentrantMutex) Name() string { return r.name }

func (r *ReentrantMutex) owner(ctx context.Context) (string, error) {
	if err := r.c.usable(r.lc.err); err != nil {
		return "", err
	}
	return ownerID(r.c, ctx, r.self)
}

func holdKey(key, owner string) string { return key + "\x00" + owner }

// Lock blocks until the owner holds the lock, ctx ends, or the Client closes.
// If the owner already holds it, Lock adds one hold and returns at once,
// keeping the first hold's lease (watchdog-renewed or fixed).
//
// When ctx ends first it returns an error matching both ErrNotObtained and
// ctx.Err(), and leaves the hold count as it was. Uncontended, Lock is one
// round trip.
func (r *ReentrantMutex) Lock(ctx context.Context) (err error) {
	ctx, sp := r.c.tel.start(ctx, kindReentrantName, "dlock.ReentrantMutex.Lock", r.name, r.lc.lease)
	defer func() { sp.endAcquire(err, err == nil, true) }()
	owner, err := r.owner(ctx)
	if err != nil {
		return err
	}
	if ctx.Err() != nil {
		return notObtained("lock", r.name, ctx)
	}
	try := func() (bool, time.Duration, error) { return r.attempt(ctx, owner) }
	ok, left, err := try()
	if err != nil || ok {
		return err
	}
	return r.c.wait(ctx, "lock", r.name, r.channel, waitAs{owner: owner, metric: kindReentrantName}, left, try)
}

// TryLock takes or re-enters the lock if no other owner holds it, and
// reports whether it did, in one round trip. Another owner's hold is
// (false, nil).
func (r *ReentrantMutex) TryLock(ctx context.Context) (ok bool, err error) {
	ctx, sp := r.c.tel.start(ctx, kindReentrantName, "dlock.ReentrantMutex.TryLock", r.name, r.lc.lease)
	defer func() { sp.endAcquire(err, ok, false) }()
	owner, err := r.owner(ctx)
	if err != nil {
		return false, err
	}
	if ctx.Err() != nil {
		return false, notObtained("trylock", r.name, ctx)
	}
	ok, _, err = r.attempt(ctx, owner)
	return ok && err == nil, err
}

// attempt makes one acquisition attempt and records its outcome, under the
// owner's gate (see holds.go).
func (r *ReentrantMutex) attempt(ctx context.Context, owner string) (bool, time.Duration, error) {
	hk := holdKey(r.key, owner)
	defer r.c.gate(hk)()
	ttl, renew := r.c.leaseOf(r.lc)
	nc := detach(ctx) // a try's outcome must be known
	sent := time.Now()
	res, err := r.c.script(nc, scripts.ReentrantTry, []string{r.key}, owner, millis(ttl)).Slice()
	var v int64
	var holder string
	if err == nil {
		v, holder, err = pair(res)
	}
	if err != nil {
		if !isRedisError(err) {
			r.c.reconcile(nc, hk,
				func(ctx context.Context) (int64, error) { return r.c.rdb.HGet(ctx, r.key, owner).Int64() },
				func(ctx context.Context) { _, _ = r.release(ctx, owner) })
		}
		return false, 0, redisErr("lock", r.name, r.key, err)
	}
	if v < 1 {
		left := time.Duration(-v) * time.Millisecond
		blocked(ctx, holder, left)
		return false, left, nil
	}
	if ctx.Err() != nil {
		// Granted after ctx ended: give the hold back, so that an error
		// return leaves the count as it was.
		_, _ = r.release(nc, owner)
		return false, 0, notObtained("lock", r.name, ctx)
	}
	if !r.c.trackHold(hk, v, func() *lease { return newLease(ctx, kindReentrantName, r.name, r.key, "h"+owner, renew, ttl, sent) }) {
		_, _ = r.release(nc, owner)
		return false, 0, closedErr("lock", r.name)
	}
	if v == 1 {
		r.c.waits.wakeOwner(r.channel, owner) // the owner's other waiters re-enter
	}
	annotate(ctx, attrHoldCount.Int64(v))
	return true, 0, nil
}

func (r *ReentrantMutex) release(ctx context.Context, owner string) (int64, error) {
	n, err := r.c.script(ctx, scripts.ReentrantUnlock, []string{r.key, r.channel}, owner, r.c.releaseOne()).Int64()
	if err != nil {
		r.c.wakeUnknown(r.channel, err)
		return 0, redisErr("unlock", r.name, r.key, err)
	}
	if n == 0 {
		r.c.waits.wake(r.channel, wakeOne, wakeLocal)
	}
	return n, nil
}

// Unlock drops one of the owner's holds; the last one releases the lock and
// wakes one waiter. One round trip.
//
// It returns an error matching ErrNotHeld when the owner holds nothing, and
// one matching ErrLost when the owner's hold had been lost; nothing else
// changes then. Like Mutex.Unlock, it runs even when ctx has ended.
func (r *ReentrantMutex) Unlock(ctx context.Context) (err error) {
	ctx, sp := r.c.tel.start(ctx, kindReentrantName, "dlock.ReentrantMutex.Unlock", r.name, r.lc.lease)
	defer func() { sp.endRelease(err) }()
	owner, err := r.owner(ctx)
	if err != nil {
		return err
	}
	hk := holdKey(r.key, owner)
	defer r.c.gate(hk)()
	l := r.c.beginUnlock(hk)
	n, err := r.release(detach(ctx), owner)
	return r.c.finishUnlock("unlock", r.name, hk, l, n, err)
}

// HoldCount returns how many holds the owner in ctx has on the lock (0 when
// none), as Redis sees it.
func (r *ReentrantMutex) HoldCount(ctx context.Context) (int, error) {
	owner, err := r.owner(ctx)
	if err != nil {
		return 0, err
	}
	n, err := r.c.rdb.HGet(ctx, r.key, owner).Int()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, redisErr("holdcount", r.name, r.key, err)
	}
	return n, nil
}

// IsLocked reports whether any owner holds the lock.
func (r *ReentrantMutex) IsLocked(ctx context.Context) (bool, error) {
	if err := r.c.usable(r.lc.err); err != nil {
		return false, err
	}
	n, err := r.c.rdb.HLen(ctx, r.key).Result()
	if err != nil {
		return false, redisErr("islocked", r.name, r.key, err)
	}
	return n > 0, nil
}

// TTL returns how long the current hold's lease has left, whoever holds it,
// or 0 when the lock is free. Under the watchdog it stays between two and
// three thirds of the watchdog timeout while held.
func (r *ReentrantMutex) TTL(ctx context.Context) (time.Duration, error) {
	if err := r.c.usable(r.lc.err); err != nil {
		return 0, err
	}
	d, err := r.c.rdb.PTTL(ctx, r.key).Result()
	if err != nil {
		return 0, redisErr("ttl", r.name, r.key, err)
	}
	if d < 0 { // -2: no key; -1: no expiry, which dlock never leaves
		return 0, nil
	}
	return d, nil
}

// ForceUnlock deletes the lock whoever holds it and wakes a waiter. It
// reports whether there was a hold to delete. Holders on other Clients learn
// of it at their next renewal, through Lost and their hold contexts; holders
// on this Client learn at once. It is for operators and tests: a holder that
// is still running loses its exclusion.
func (r *ReentrantMutex) ForceUnlock(ctx context.Context) (deleted bool, err error) {
	ctx, sp := r.c.tel.start(ctx, kindReentrantName, "dlock.ReentrantMutex.ForceUnlock", r.name, r.lc.lease)
	defer func() { sp.endOther(err) }()
	if err := r.c.usable(r.lc.err); err != nil {
		return false, err
	}
	n, err := r.c.script(detach(ctx), scripts.ForceUnlock, []string{r.key, r.channel},
		r.c.releaseOne(), "hash").Int64()
	if err != nil {
		return false, redisErr("forceunlock", r.name, r.key, err)
	}
	if n == 0 {
		return false, nil
	}
	r.c.waits.wake(r.channel, wakeOne, wakeLocal)
	c := r.c
	prefix := r.key + "\x00"
	c.holdsMu.Lock()
	var mine []*lease
	for hk, l := range c.holds {
		if strings.HasPrefix(hk, prefix) {
			mine = append(mine, l)
		}
	}
	c.holdsMu.Unlock()
	for _, l := range mine {
		c.wd.lose(l, fmt.Errorf("%w: force-unlocked", ErrLost))
	}
	return true, nil
}

// Lost returns a channel that is closed if the hold of the owner in ctx is
// lost (see Mutex.Lost), or nil when that owner holds nothing through this
// Client.
func (r *ReentrantMutex) Lost(ctx context.Context) <-chan struct{} {
	return r.c.wd.lostOf(r.lease(ctx))
}

// HoldContext returns a copy of ctx that is cancelled when the hold of the
// owner in ctx ends: by its last Unlock, or by loss, in which case
// context.Cause reports an error matching ErrLost. Without a hold it is
// already cancelled, with cause ErrNotHeld. Call the CancelFunc when done.
func (r *ReentrantMutex) HoldContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return r.c.wd.holdContext(ctx, r.lease(ctx))
}

func (r *ReentrantMutex) lease(ctx context.Context) *lease {
	owner, err := r.owner(ctx)
	if err != nil {
		return nil
	}
	return r.c.heldLease(holdKey(r.key, owner))
}
