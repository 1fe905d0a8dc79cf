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
	o, ok := OwnerFrom(ctx)
	if !ok {
		return r.self, nil
	}
	if o == "" {
		return "", invalidf("empty owner in context")
	}
	return r.c.id + ":o:" + o, nil
}

func holdKey(key, owner string) string { return key + "\x00" + owner }

// Lock blocks until the owner holds the lock, ctx ends, or the Client closes.
// If the owner already holds it, Lock adds one hold and returns at once,
// keeping the first hold's lease (watchdog-renewed or fixed).
//
// When ctx ends first it returns an error matching both ErrNotObtained and
// ctx.Err(), and leaves the hold count as it was. Uncontended, Lock is one
// round trip.
func (r *ReentrantMutex) Lock(ctx context.Context) error {
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
	return r.c.wait(ctx, "lock", r.name, r.channel, waitAs{}, left, try)
}

// TryLock takes or re-enters the lock if no other owner holds it, and
// reports whether it did, in one round trip. Another owner's hold is
// (false, nil).
func (r *ReentrantMutex) TryLock(ctx context.Context) (bool, error) {
	owner, err := r.owner(ctx)
	if err != nil {
		return false, err
	}
	if ctx.Err() != nil {
		return false, notObtained("trylock", r.name, ctx)
	}
	ok, _, err := r.attempt(ctx, owner)
	return ok && err == nil, err
}

// attempt makes one acquisition attempt and records its outcome. The owner's
// gate orders it with the owner's other calls on this Client, so that the
// locally tracked hold count follows the server's.
func (r *ReentrantMutex) attempt(ctx context.Context, owner string) (bool, time.Duration, error) {
	hk := holdKey(r.key, owner)
	defer r.c.gate(hk)()
	ttl, renew := r.c.leaseOf(r.lc)
	nc := context.WithoutCancel(ctx) // a try's outcome must be known
	sent := time.Now()
	v, err := scripts.ReentrantTry.Run(nc, r.c.rdb, []string{r.key}, owner, millis(ttl)).Int64()
	if err != nil {
		if !isRedisError(err) {
			r.reconcile(nc, owner, hk)
		}
		return false, 0, redisErr("lock", r.name, r.key, err)
	}
	if v < 1 {
		return false, time.Duration(-v) * time.Millisecond, nil
	}
	if ctx.Err() != nil {
		// Granted after ctx ended: give the hold back, so that an error
		// return leaves the count as it was.
		_, _ = r.release(nc, owner)
		return false, 0, notObtained("lock", r.name, ctx)
	}
	return true, 0, r.acquired(owner, hk, v, ttl, renew, sent)
}

// acquired records that the server now counts n holds for the owner. A first
// hold (n == 1) gets a new lease; a re-entry updates the count. Called with
// the owner's gate held.
func (r *ReentrantMutex) acquired(owner, hk string, n int64, ttl time.Duration, renew bool, sent time.Time) error {
	c := r.c
	c.holdsMu.Lock()
	old := c.holds[hk]
	if n > 1 && old != nil && c.wd.isHeld(old) {
		old.count = n
		c.holdsMu.Unlock()
		return nil
	}
	l := newLease(r.name, r.key, "h"+owner, renew, ttl, sent)
	l.count = n
	c.holds[hk] = l
	c.holdsMu.Unlock()
	if old != nil {
		// The server had no hold for the owner although this Client still
		// tracked one: that hold was lost and its holder must hear of it.
		c.wd.lose(old, fmt.Errorf("%w: hold gone before the owner locked again", ErrLost))
	}
	if !c.wd.add(l) {
		_, _ = r.release(context.Background(), owner)
		return fmt.Errorf("dlock: lock %q: %w", r.name, ErrClosed)
	}
	return nil
}

// reconcile runs after an acquisition whose reply was lost: if the server
// counts one hold more than this Client knew of, the attempt went through,
// and since the caller gets an error, that hold is given back. The owner's
// gate is held, and only this Client writes the owner's field, so the
// difference can only come from that attempt.
func (r *ReentrantMutex) reconcile(ctx context.Context, owner, hk string) {
	var known int64
	r.c.holdsMu.Lock()
	if l := r.c.holds[hk]; l != nil {
		known = l.count
	}
	r.c.holdsMu.Unlock()
	cur, err := r.c.rdb.HGet(ctx, r.key, owner).Int64()
	if err == nil && cur == known+1 {
		_, _ = r.release(ctx, owner)
	}
}

func (r *ReentrantMutex) release(ctx context.Context, owner string) (int64, error) {
	n, err := scripts.ReentrantUnlock.Run(ctx, r.c.rdb, []string{r.key, r.channel}, owner, r.c.releaseOne()).Int64()
	if err != nil {
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
func (r *ReentrantMutex) Unlock(ctx context.Context) error {
	owner, err := r.owner(ctx)
	if err != nil {
		return err
	}
	c := r.c
	hk := holdKey(r.key, owner)
	defer c.gate(hk)()
	c.holdsMu.Lock()
	l := c.holds[hk]
	c.holdsMu.Unlock()
	if l != nil {
		c.wd.beginRelease(l)
	}
	n, err := r.release(context.WithoutCancel(ctx), owner)
	if err != nil {
		if l != nil {
			c.wd.abortRelease(l)
		}
		return err
	}
	if n > 0 {
		if l == nil {
			return nil
		}
		c.wd.abortRelease(l) // still held: renewals go on
		l.count = n
		if cause := c.wd.lostCause(l); cause != nil {
			return fmt.Errorf("dlock: unlock %q: %w", r.name, cause)
		}
		return nil
	}
	if l != nil {
		c.holdsMu.Lock()
		if c.holds[hk] == l {
			delete(c.holds, hk)
		}
		c.holdsMu.Unlock()
	}
	switch {
	case n < 0 && l == nil:
		return fmt.Errorf("dlock: unlock %q: %w", r.name, ErrNotHeld)
	case n < 0:
		c.wd.lose(l, fmt.Errorf("%w: hold gone at unlock", ErrLost))
		return fmt.Errorf("dlock: unlock %q: %w: %w", r.name, ErrLost, ErrNotHeld)
	case l != nil:
		if cause := c.wd.released(l); cause != nil {
			return fmt.Errorf("dlock: unlock %q: %w", r.name, cause)
		}
	}
	return nil
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
func (r *ReentrantMutex) ForceUnlock(ctx context.Context) (bool, error) {
	if err := r.c.usable(r.lc.err); err != nil {
		return false, err
	}
	n, err := scripts.ForceUnlock.Run(context.WithoutCancel(ctx), r.c.rdb, []string{r.key, r.channel},
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
	if l := r.lease(ctx); l != nil {
		return l.lost
	}
	return nil
}

// HoldContext returns a copy of ctx that is cancelled when the hold of the
// owner in ctx ends: by its last Unlock, or by loss, in which case
// context.Cause reports an error matching ErrLost. Without a hold it is
// already cancelled, with cause ErrNotHeld. Call the CancelFunc when done.
func (r *ReentrantMutex) HoldContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return holdContext(ctx, r.lease(ctx))
}

func (r *ReentrantMutex) lease(ctx context.Context) *lease {
	owner, err := r.owner(ctx)
	if err != nil {
		return nil
	}
	r.c.holdsMu.Lock()
	defer r.c.holdsMu.Unlock()
	return r.c.holds[holdKey(r.key, owner)]
}
