package dlock

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/scripts"
)

// RWMutex is a distributed reader/writer lock: many readers or one writer,
// across processes. Both sides are reentrant per owner, with the owner model
// of ReentrantMutex (WithOwner; else the handle).
//
// It prefers writers, like sync.RWMutex: once a writer waits, new readers
// queue behind it, so a steady stream of readers cannot starve a writer. An
// owner that already reads may still re-enter its read hold, since making it
// wait for a writer that waits for it would deadlock. A writer may also take
// the read lock (downgrade: Lock, RLock, Unlock leaves a read hold). A reader
// asking for the write lock gets ErrUpgrade at once instead of deadlocking.
//
// Each owner's read hold has its own lease, renewed by the watchdog, so a
// crashed reader holds writers back only until its lease runs out. A writer's
// waiting mark is renewed the same way while it waits. A release wakes those
// who can proceed: one writer, or all readers.
//
// Make one with Client.RWMutex. The zero RWMutex is not usable.
type RWMutex struct {
	c       *Client
	name    string
	keys    []string // W, RL, RC, WW: see scripts/rw_common.lua
	keysCh  []string // keys and the channel
	channel string
	lc      lockConfig
	self    string // owner ID used when ctx names none
}

// RWMutex returns a handle on the read-write lock called name. It sends
// nothing to Redis. An empty name or an invalid option makes every method
// return an error wrapping ErrInvalid.
func (c *Client) RWMutex(name string, opts ...LockOption) *RWMutex {
	lc := buildLockConfig(opts)
	if lc.err == nil {
		lc.err = checkName(name)
	}
	w := lockKey(c.cfg.prefix, name)
	keys := []string{w, w + ":rl", w + ":rc", w + ":ww"}
	ch := channelOf(w)
	return &RWMutex{c: c, name: name, keys: keys, keysCh: append(keys[:4:4], ch), channel: ch, lc: lc,
		self: c.id + ":h:" + rand.Text()}
}

// Name returns the lock's name, without the key prefix.
func (rw *RWMutex) Name() string { return rw.name }

func (rw *RWMutex) owner(ctx context.Context) (string, error) {
	if err := rw.c.usable(rw.lc.err); err != nil {
		return "", err
	}
	return ownerID(rw.c, ctx, rw.self)
}

// readKey and writeKey identify the owner's read and write holds in
// Client.holds; writeKey also names the owner's gate for both.
func (rw *RWMutex) readKey(owner string) string  { return holdKey(rw.keys[1], owner) }
func (rw *RWMutex) writeKey(owner string) string { return holdKey(rw.keys[0], owner) }

// RLock blocks until the owner holds a read lock, ctx ends, or the Client
// closes. When ctx ends first it returns an error matching both
// ErrNotObtained and ctx.Err(), and changes nothing.
func (rw *RWMutex) RLock(ctx context.Context) (err error) {
	ctx, sp := rw.c.tel.start(ctx, kindRWReadName, "dlock.RWMutex.RLock", rw.name, rw.lc.lease)
	defer func() { sp.endAcquire(err, err == nil, true) }()
	owner, err := rw.owner(ctx)
	if err != nil {
		return err
	}
	if ctx.Err() != nil {
		return notObtained("rlock", rw.name, ctx)
	}
	try := func() (bool, time.Duration, error) { return rw.attemptRead(ctx, owner) }
	ok, left, err := try()
	if err != nil || ok {
		return err
	}
	return rw.c.wait(ctx, "rlock", rw.name, rw.channel, waitAs{kind: kindReader, owner: owner, metric: kindRWReadName}, left, try)
}

// TryRLock takes or re-enters a read hold if no other owner writes and no
// writer waits, and reports whether it did, in one round trip.
func (rw *RWMutex) TryRLock(ctx context.Context) (ok bool, err error) {
	ctx, sp := rw.c.tel.start(ctx, kindRWReadName, "dlock.RWMutex.TryRLock", rw.name, rw.lc.lease)
	defer func() { sp.endAcquire(err, ok, false) }()
	owner, err := rw.owner(ctx)
	if err != nil {
		return false, err
	}
	if ctx.Err() != nil {
		return false, notObtained("tryrlock", rw.name, ctx)
	}
	ok, _, err = rw.attemptRead(ctx, owner)
	return ok && err == nil, err
}

func (rw *RWMutex) attemptRead(ctx context.Context, owner string) (bool, time.Duration, error) {
	defer rw.c.gate(rw.writeKey(owner))()
	hk := rw.readKey(owner)
	ttl, renew := rw.c.leaseOf(rw.lc)
	nc := detach(ctx)
	sent := time.Now()
	v, err := rw.c.script(nc, scripts.RWTryRead, rw.keys, owner, millis(ttl)).Int64()
	if err != nil {
		if !isRedisError(err) {
			rw.c.reconcile(nc, hk,
				func(ctx context.Context) (int64, error) { return rw.c.rdb.HGet(ctx, rw.keys[2], owner).Int64() },
				func(ctx context.Context) { _, _ = rw.releaseRead(ctx, owner) })
		}
		return false, 0, redisErr("rlock", rw.name, rw.keys[0], err)
	}
	if v < 1 {
		return false, time.Duration(-v) * time.Millisecond, nil
	}
	if ctx.Err() != nil {
		_, _ = rw.releaseRead(nc, owner)
		return false, 0, notObtained("rlock", rw.name, ctx)
	}
	fresh := func() *lease {
		l := newLease(ctx, kindRWReadName, rw.name, rw.keys[1], "R"+owner, renew, ttl, sent)
		l.extra = rw.keys[2:3]
		return l
	}
	if !rw.c.trackHold(hk, v, fresh) {
		_, _ = rw.releaseRead(nc, owner)
		return false, 0, closedErr("rlock", rw.name)
	}
	if v == 1 {
		rw.c.waits.wakeOwner(rw.channel, owner) // the owner may now re-enter or downgrade
	}
	annotate(ctx, attrHoldCount.Int64(v))
	return true, 0, nil
}

// Lock blocks until the owner holds the write lock, ctx ends, or the Client
// closes. While it waits, new readers queue behind it. It returns an error
// matching ErrUpgrade at once if the owner holds a read lock and not the
// write lock. When ctx ends first it returns an error matching both
// ErrNotObtained and ctx.Err(), withdraws its wait, and changes nothing.
func (rw *RWMutex) Lock(ctx context.Context) (err error) {
	ctx, sp := rw.c.tel.start(ctx, kindRWWriteName, "dlock.RWMutex.Lock", rw.name, rw.lc.lease)
	defer func() { sp.endAcquire(err, err == nil, true) }()
	owner, err := rw.owner(ctx)
	if err != nil {
		return err
	}
	if ctx.Err() != nil {
		return notObtained("lock", rw.name, ctx)
	}
	markTTL := rw.c.cfg.watchdog
	try := func() (bool, time.Duration, error) { return rw.attemptWrite(ctx, owner, markTTL) }
	ok, left, err := try()
	if err != nil || ok {
		return err
	}
	// The script left a waiting mark; the watchdog keeps it alive while this
	// caller waits, so a crashed writer stops holding readers back.
	mark := newLease(ctx, kindRWWriteName, rw.name, rw.keys[3], "z"+owner, true, markTTL, time.Now())
	mark.mark = true
	if !rw.c.wd.add(mark) {
		rw.cancelWrite(ctx, owner)
		return closedErr("lock", rw.name)
	}
	err = rw.c.wait(ctx, "lock", rw.name, rw.channel, waitAs{kind: kindWriter, owner: owner, metric: kindRWWriteName}, left, try)
	rw.c.wd.dropped(mark)
	if err != nil {
		rw.cancelWrite(ctx, owner)
	}
	return err
}

// TryLock takes or re-enters the write lock if nobody else holds the lock,
// and reports whether it did, in one round trip. It leaves no waiting mark.
func (rw *RWMutex) TryLock(ctx context.Context) (ok bool, err error) {
	ctx, sp := rw.c.tel.start(ctx, kindRWWriteName, "dlock.RWMutex.TryLock", rw.name, rw.lc.lease)
	defer func() { sp.endAcquire(err, ok, false) }()
	owner, err := rw.owner(ctx)
	if err != nil {
		return false, err
	}
	if ctx.Err() != nil {
		return false, notObtained("trylock", rw.name, ctx)
	}
	ok, _, err = rw.attemptWrite(ctx, owner, 0)
	return ok && err == nil, err
}

func (rw *RWMutex) attemptWrite(ctx context.Context, owner string, markTTL time.Duration) (bool, time.Duration, error) {
	hk := rw.writeKey(owner)
	defer rw.c.gate(hk)()
	ttl, renew := rw.c.leaseOf(rw.lc)
	nc := detach(ctx)
	sent := time.Now()
	v, err := rw.c.script(nc, scripts.RWTryWrite, rw.keys, owner, millis(ttl), millis(markTTL)).Int64()
	if err != nil {
		if strings.HasPrefix(err.Error(), "DLOCK_UPGRADE") {
			return false, 0, fmt.Errorf("dlock: lock %q: %w", rw.name, ErrUpgrade)
		}
		if !isRedisError(err) {
			rw.c.reconcile(nc, hk,
				func(ctx context.Context) (int64, error) { return rw.c.rdb.HGet(ctx, rw.keys[0], owner).Int64() },
				func(ctx context.Context) { _, _ = rw.releaseWrite(ctx, owner) })
			if markTTL > 0 {
				rw.cancelWrite(nc, owner) // the lost reply may have left a waiting mark
			}
		}
		return false, 0, redisErr("lock", rw.name, rw.keys[0], err)
	}
	if v < 1 {
		return false, time.Duration(-v) * time.Millisecond, nil
	}
	if ctx.Err() != nil {
		_, _ = rw.releaseWrite(nc, owner)
		return false, 0, notObtained("lock", rw.name, ctx)
	}
	if !rw.c.trackHold(hk, v, func() *lease { return newLease(ctx, kindRWWriteName, rw.name, rw.keys[0], "h"+owner, renew, ttl, sent) }) {
		_, _ = rw.releaseWrite(nc, owner)
		return false, 0, closedErr("lock", rw.name)
	}
	if v == 1 {
		rw.c.waits.wakeOwner(rw.channel, owner) // the owner's other waiters re-enter
	}
	annotate(ctx, attrHoldCount.Int64(v))
	return true, 0, nil
}

// cancelWrite withdraws the owner's waiting mark, waking the readers it kept
// out. Best effort: a mark left behind expires with its lease.
func (rw *RWMutex) cancelWrite(ctx context.Context, owner string) {
	msg, err := rw.c.script(detach(ctx), scripts.RWCancelWrite, rw.keysCh, owner, rw.c.id).Text()
	if err != nil {
		rw.c.wakeUnknown(rw.channel, err)
		return
	}
	rw.wakeLocal(msg)
}

// wakeLocal applies a release message the scripts published to this
// Client's own waiters, whose echo the Client ignores.
func (rw *RWMutex) wakeLocal(msg string) {
	if msg != "" {
		_, spec := parseRelease(msg)
		rw.c.waits.wake(rw.channel, spec, wakeLocal)
	}
}

// runRelease runs an rw_unlock script, wakes the local waiters its message
// names, and returns the owner's remaining holds (-1: none).
func (rw *RWMutex) runRelease(ctx context.Context, op string, s *redis.Script, owner string) (int64, error) {
	res, err := s.Run(ctx, rw.c.rdb, rw.keysCh, owner, rw.c.id).Slice()
	if err != nil {
		rw.c.wakeUnknown(rw.channel, err)
		return 0, redisErr(op, rw.name, rw.keys[0], err)
	}
	n, msg, err := pair(res)
	if err != nil {
		return 0, fmt.Errorf("dlock: %s %q: %w", op, rw.name, err)
	}
	rw.wakeLocal(msg)
	return n, nil
}

func (rw *RWMutex) releaseRead(ctx context.Context, owner string) (int64, error) {
	return rw.runRelease(ctx, "runlock", scripts.RWUnlockRead, owner)
}

func (rw *RWMutex) releaseWrite(ctx context.Context, owner string) (int64, error) {
	return rw.runRelease(ctx, "unlock", scripts.RWUnlockWrite, owner)
}

// RUnlock drops one of the owner's read holds; the last reader out wakes one
// waiting writer (or everyone, if none waits). It returns an error matching
// ErrNotHeld when the owner reads nothing, or ErrLost when its read hold was
// lost. Like Mutex.Unlock, it runs even when ctx has ended.
func (rw *RWMutex) RUnlock(ctx context.Context) (err error) {
	ctx, sp := rw.c.tel.start(ctx, kindRWReadName, "dlock.RWMutex.RUnlock", rw.name, rw.lc.lease)
	defer func() { sp.endRelease(err) }()
	owner, err := rw.owner(ctx)
	if err != nil {
		return err
	}
	defer rw.c.gate(rw.writeKey(owner))()
	hk := rw.readKey(owner)
	l := rw.c.beginUnlock(hk)
	n, err := rw.releaseRead(detach(ctx), owner)
	return rw.c.finishUnlock("runlock", rw.name, hk, l, n, err)
}

// Unlock drops one of the owner's write holds; the last one releases the
// write lock and wakes whoever can proceed: one waiting writer, else all
// readers. It returns an error matching ErrNotHeld when the owner does not
// write, or ErrLost when its write hold was lost. Like Mutex.Unlock, it runs
// even when ctx has ended.
func (rw *RWMutex) Unlock(ctx context.Context) (err error) {
	ctx, sp := rw.c.tel.start(ctx, kindRWWriteName, "dlock.RWMutex.Unlock", rw.name, rw.lc.lease)
	defer func() { sp.endRelease(err) }()
	owner, err := rw.owner(ctx)
	if err != nil {
		return err
	}
	hk := rw.writeKey(owner)
	defer rw.c.gate(hk)()
	l := rw.c.beginUnlock(hk)
	n, err := rw.releaseWrite(detach(ctx), owner)
	return rw.c.finishUnlock("unlock", rw.name, hk, l, n, err)
}

// Lost returns a channel that is closed if the write hold of the owner in
// ctx is lost, or nil when that owner does not write through this Client.
func (rw *RWMutex) Lost(ctx context.Context) <-chan struct{} {
	return rw.c.wd.lostOf(rw.holdLease(ctx, rw.writeKey))
}

// RLost is Lost for the owner's read hold.
func (rw *RWMutex) RLost(ctx context.Context) <-chan struct{} {
	return rw.c.wd.lostOf(rw.holdLease(ctx, rw.readKey))
}

// HoldContext returns a copy of ctx cancelled when the write hold of the
// owner in ctx ends (see Mutex.HoldContext).
func (rw *RWMutex) HoldContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return rw.c.wd.holdContext(ctx, rw.holdLease(ctx, rw.writeKey))
}

// RHoldContext is HoldContext for the owner's read hold.
func (rw *RWMutex) RHoldContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return rw.c.wd.holdContext(ctx, rw.holdLease(ctx, rw.readKey))
}

func (rw *RWMutex) holdLease(ctx context.Context, hk func(string) string) *lease {
	owner, err := rw.owner(ctx)
	if err != nil {
		return nil
	}
	return rw.c.heldLease(hk(owner))
}
