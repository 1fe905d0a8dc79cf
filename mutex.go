package dlock

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/scripts"
)

// Mutex is a distributed mutual exclusion lock that behaves like sync.Mutex:
// it is not reentrant, and one handle may be shared by many goroutines, which
// then exclude each other just as goroutines on other handles and in other
// processes do. As with sync.Mutex, the hold belongs to the handle, not to a
// goroutine: any goroutine may Unlock what another locked.
//
// Each acquisition stores a fresh random token in the lock's key, and Unlock
// deletes the key only if it still holds that token, so a hold that expired
// can never release someone else's newer hold.
//
// Make one with Client.Mutex. The zero Mutex is not usable.
type Mutex struct {
	c       *Client
	name    string
	key     string
	keys    []string // K, Q, QE and the channel: see scripts/mutex_common.lua
	channel string
	lc      lockConfig

	mu   sync.Mutex
	hold *lease // the current hold, nil when not held
}

// Mutex returns a handle on the plain lock called name. It sends nothing to
// Redis. An empty name or an invalid option makes every method return an
// error wrapping ErrInvalid.
func (c *Client) Mutex(name string, opts ...LockOption) *Mutex {
	lc := buildLockConfig(opts)
	if lc.err == nil {
		lc.err = checkName(name)
	}
	key := lockKey(c.cfg.prefix, name)
	ch := channelOf(key)
	return &Mutex{c: c, name: name, key: key, keys: []string{key, key + ":mq", key + ":mqe", ch}, channel: ch, lc: lc}
}

// Name returns the lock's name, without the key prefix.
func (m *Mutex) Name() string { return m.name }

// Lock blocks until it holds the lock, ctx ends, or the Client closes.
//
// When ctx ends first it returns an error matching both ErrNotObtained and
// ctx.Err(), and leaves nothing held: a grant that raced the end of ctx is
// passed on. Uncontended, Lock is one round trip to Redis. A blocked Lock
// joins the lock's queue in Redis and waits, without polling, for a release
// to hand it the lock: waiters are served in arrival order, whichever Client
// they wait on, and a handed-over lock needs no further round trip.
func (m *Mutex) Lock(ctx context.Context) (err error) {
	ctx, sp := m.c.tel.start(ctx, kindMutexName, "dlock.Mutex.Lock", m.name, m.lc.lease)
	defer func() { sp.endAcquire(err, err == nil, true) }()
	if err := m.c.usable(m.lc.err); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return notObtained("lock", m.name, ctx)
	}
	token := m.c.newToken()
	ttl, renew := m.c.leaseOf(m.lc)
	nc := detach(ctx) // a try's outcome must never be unknown
	sent := time.Now()
	// While this Client has waiters queued on the lock, it is held: go
	// straight to the queue instead of paying for a SET that must fail.
	if !m.c.waits.has(m.channel) {
		set := redis.NewBoolCmd(nc, "set", m.key, token, "px", millis(ttl), "nx")
		err := m.c.do(nc, set)
		ok := set.Val()
		if err != nil {
			return m.unknownOutcome(nc, token, err)
		}
		if ok {
			return m.acquired(ctx, token, ttl, renew, sent)
		}
	}
	return m.lockSlow(ctx, nc, token, ttl, renew)
}

// lockSlow queues the caller in Redis and waits to be handed the lock (see
// scripts/mutex_common.lua). The queue entry is a waiting mark that the
// watchdog renews; a waiter that dies stops holding the queue up when its
// mark runs out.
// nc is ctx detached from its cancellation, for the tries.
func (m *Mutex) lockSlow(ctx, nc context.Context, token string, ttl time.Duration, renew bool) error {
	markTTL, _ := m.c.leaseOf(lockConfig{})
	var mark *lease
	var sent time.Time
	requeued := false // queued again after losing a place: see handed
	try := func() (bool, time.Duration, error) {
		sent = time.Now()
		ok, left, err := m.try(nc, token, ttl, markTTL)
		if err != nil || ok || mark != nil && m.c.wd.isHeld(mark) {
			return ok, left, err
		}
		// Queued now: have the watchdog keep the place. A mark that a
		// renewal found gone (its place was purged, or handed the lock
		// that has since run out) is replaced, since this try queued the
		// waiter again.
		requeued = requeued || mark != nil
		mark = newLease(ctx, kindMutexName, m.name, m.keys[2], "R"+token, true, markTTL, sent)
		mark.extra, mark.mark = m.keys[1:2], true
		// When a renewal finds the place gone, look again at once: the lock
		// was handed over (then the try takes it), or the place was purged
		// (then the try queues again).
		mark.onLost = func() {
			m.c.waits.wake(m.channel, wakeSpec{ids: []string{token}}, wakeLocal)
		}
		if !m.c.wd.add(mark) {
			return false, 0, closedErr("lock", m.name)
		}
		return false, left, nil
	}
	// A release handed the lock to token. With the watchdog renewing it, the
	// hold's lease is what remained of the mark, which the watchdog kept at
	// least two thirds of a lease ahead: nothing more to ask Redis. A
	// WithLease hold tries once more, which sets its own lease. So does a
	// waiter that lost its place and queued again: the message may be a
	// late one for the earlier place, whose hold may have run out and gone
	// to someone else, and the try finds out.
	handed := func() bool {
		if !renew || mark == nil || requeued {
			return false
		}
		markDeadline := m.c.wd.deadline(mark)
		if time.Until(markDeadline) < markTTL/3 {
			return false
		}
		sent = markDeadline.Add(-ttl)
		return true
	}
	err := m.c.wait(ctx, "lock", m.name, m.channel, waitAs{id: token, metric: kindMutexName, handed: handed}, 0, try)
	if mark != nil {
		m.c.wd.dropped(mark)
	}
	if err != nil {
		m.cancel(nc, token)
		return err
	}
	return m.acquired(ctx, token, ttl, renew, sent)
}

// TryLock takes the lock if it is free and reports whether it did, in one
// round trip. A lock held elsewhere is (false, nil); an error means Redis
// could not be asked, or ctx had ended. As with sync.Mutex, correct uses of
// TryLock are rare: most callers want Lock with a deadline in ctx.
func (m *Mutex) TryLock(ctx context.Context) (ok bool, err error) {
	ctx, sp := m.c.tel.start(ctx, kindMutexName, "dlock.Mutex.TryLock", m.name, m.lc.lease)
	defer func() { sp.endAcquire(err, ok, false) }()
	if err := m.c.usable(m.lc.err); err != nil {
		return false, err
	}
	if ctx.Err() != nil {
		return false, notObtained("trylock", m.name, ctx)
	}
	token := m.c.newToken()
	ttl, renew := m.c.leaseOf(m.lc)
	sent := time.Now()
	ok, _, err = m.try(detach(ctx), token, ttl, 0)
	if err != nil || !ok {
		return false, err
	}
	if err := m.acquired(ctx, token, ttl, renew, sent); err != nil {
		return false, err
	}
	return true, nil
}

// try takes the lock for token if it is free and nobody is queued ahead, or
// finds that a release handed it to token. Otherwise it queues token when
// markTTL > 0 and returns how long the holder's lease has left.
func (m *Mutex) try(ctx context.Context, token string, ttl, markTTL time.Duration) (bool, time.Duration, error) {
	res, err := m.c.script(ctx, scripts.MutexTry, m.keys, token, millis(ttl), millis(markTTL), m.c.id).Slice()
	if err != nil {
		return false, 0, m.unknownOutcome(ctx, token, err)
	}
	v, holder, err := pair(res)
	if err != nil {
		return false, 0, fmt.Errorf("dlock: lock %q: %w", m.name, err)
	}
	if v >= 1 {
		return true, 0, nil
	}
	left := time.Duration(-v) * time.Millisecond
	from := clientOfToken(holder)
	if from == m.c.id {
		// The holder may be a waiter of this Client that the script just
		// handed the lock to, or one whose hand-over message is on its way:
		// either way it holds the lock and is told so here.
		m.handedTo(holder)
	}
	blocked(ctx, from, left)
	return false, left, nil
}

// unknownOutcome handles an acquisition that failed in transit: Redis may
// have granted it with no reply arriving. The token is unique to this
// attempt, so giving back whatever it holds is always safe, and it keeps a
// failed Lock from leaving a hold or a queue entry behind. Local waiters are
// woken to look again.
func (m *Mutex) unknownOutcome(ctx context.Context, token string, err error) error {
	if !isRedisError(err) {
		m.cancel(ctx, token)
		// The lost reply may have named a waiter of this Client that the
		// script handed the lock to, which nobody else will wake.
		m.c.wakeUnknown(m.channel, err)
	}
	return redisErr("lock", m.name, m.key, err)
}

// cancel takes token out of the queue and passes on the lock if a release
// handed it to token meanwhile. Best effort: a queue entry left behind is
// dropped when its mark runs out.
func (m *Mutex) cancel(ctx context.Context, token string) {
	v, err := m.c.script(ctx, scripts.MutexCancel, m.keys, token, m.c.id).Result()
	if err != nil {
		m.c.wakeUnknown(m.channel, err)
		return
	}
	m.handedTo(v)
}

// handedTo wakes the waiter a script handed the lock to, if it waits on this
// Client: scripts publish no message for a waiter of the calling Client.
// v is the script's reply; only a token (a string) names a waiter.
//
// Having woken one, the caller yields its processor, as sync.Mutex does when
// it hands over in starvation mode: the new holder, not the old one, should
// run next.
func (m *Mutex) handedTo(v any) {
	if next, ok := v.(string); ok {
		if m.c.waits.wake(m.channel, wakeSpec{kind: kindHanded, ids: []string{next}}, wakeLocal) > 0 {
			runtime.Gosched()
		}
	}
}

// acquired records a hold the server granted, unless ctx ended meanwhile, in
// which case the hold is given back so that a failed Lock leaves nothing.
func (m *Mutex) acquired(ctx context.Context, token string, ttl time.Duration, renew bool, sent time.Time) error {
	if ctx.Err() != nil {
		_, _ = m.release(detach(ctx), token)
		return notObtained("lock", m.name, ctx)
	}
	l := newLease(ctx, kindMutexName, m.name, m.key, "s"+token, renew, ttl, sent)
	m.mu.Lock()
	old := m.hold
	m.hold = l
	m.mu.Unlock()
	if old != nil {
		// The key was free, so an older hold of this handle that nobody
		// unlocked had already expired or been deleted.
		m.c.wd.lose(old, fmt.Errorf("%w: lease ran out before a new Lock on the handle", ErrLost))
	}
	if !m.c.wd.add(l) {
		_, _ = m.release(context.Background(), token)
		return fmt.Errorf("dlock: lock %q: %w", m.name, ErrClosed)
	}
	annotate(ctx, attrHoldCount.Int(1))
	return nil
}

// release gives up token's hold, handing the lock to the first waiter in
// its queue if there is one. It reports whether token held the lock.
func (m *Mutex) release(ctx context.Context, token string) (bool, error) {
	v, err := m.c.script(ctx, scripts.MutexUnlock, m.keys, token, m.c.id).Result()
	if err != nil {
		m.c.wakeUnknown(m.channel, err)
		return false, redisErr("unlock", m.name, m.key, err)
	}
	m.handedTo(v)
	return v != int64(0), nil
}

// Unlock releases the handle's current hold, in one round trip. If callers
// are queued, the lock passes straight to the first of them.
//
// It returns an error matching ErrNotHeld when the handle holds nothing, and
// one matching ErrLost (and ErrNotHeld, when the key was no longer ours) when
// the hold was lost before Unlock; in both cases nothing else changes. Unlock
// sends its request even when ctx has ended, since leaving a lock behind is
// worse than a late call; ctx still carries values such as trace spans.
func (m *Mutex) Unlock(ctx context.Context) (err error) {
	ctx, sp := m.c.tel.start(ctx, kindMutexName, "dlock.Mutex.Unlock", m.name, m.lc.lease)
	defer func() { sp.endRelease(err) }()
	if err := m.c.usable(m.lc.err); err != nil {
		return err
	}
	m.mu.Lock()
	l := m.hold
	m.hold = nil
	m.mu.Unlock()
	if l == nil {
		return fmt.Errorf("dlock: unlock %q: %w", m.name, ErrNotHeld)
	}
	m.c.wd.beginRelease(l)
	ok, err := m.release(detach(ctx), l.spec[1:])
	if err != nil {
		m.c.wd.abortRelease(l)
		m.mu.Lock()
		if m.hold == nil {
			m.hold = l // let the caller retry
		}
		m.mu.Unlock()
		return err
	}
	if !ok {
		m.c.wd.lose(l, fmt.Errorf("%w: hold gone at unlock", ErrLost))
		return fmt.Errorf("dlock: unlock %q: %w: %w", m.name, ErrLost, ErrNotHeld)
	}
	if cause := m.c.wd.released(l); cause != nil {
		return fmt.Errorf("dlock: unlock %q: %w", m.name, cause)
	}
	return nil
}

// Lost returns a channel that is closed if the current hold is lost: its key
// vanished, renewals failed for a whole lease, its WithLease lease ran out,
// or the Client closed. Unlock does not close it. Lost returns nil (a channel
// that never fires) when the handle holds nothing.
func (m *Mutex) Lost() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.c.wd.lostOf(m.hold)
}

// HoldContext returns a copy of parent that is cancelled when the current
// hold ends: by Unlock, or by loss, in which case context.Cause reports an
// error matching ErrLost. Work done under the lock should use it, so that it
// stops when exclusion can no longer be promised. Without a hold the context
// is already cancelled, with cause ErrNotHeld. Call the CancelFunc when done.
func (m *Mutex) HoldContext(parent context.Context) (context.Context, context.CancelFunc) {
	m.mu.Lock()
	l := m.hold
	m.mu.Unlock()
	return m.c.wd.holdContext(parent, l)
}

// newToken returns a fresh token for a Mutex acquisition: the Client's ID,
// which tells whoever waits who holds the lock, and 128 random bits, which
// make the token unique.
func (c *Client) newToken() string {
	var random [16]byte
	_, _ = rand.Read(random[:]) // never fails (crypto/rand)
	b := make([]byte, 0, len(c.id)+1+tokenEncoding.EncodedLen(len(random)))
	b = append(b, c.id...)
	b = append(b, '.')
	return string(tokenEncoding.AppendEncode(b, random[:]))
}

// tokenEncoding spells the random part of a token as rand.Text does.
var tokenEncoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// clientOfToken returns the ID of the Client that wrote a Mutex token.
func clientOfToken(token string) string {
	id, _, _ := strings.Cut(token, ".")
	return id
}

// leaseOf returns the lease a hold gets and whether the watchdog renews it.
func (c *Client) leaseOf(lc lockConfig) (time.Duration, bool) {
	if lc.lease > 0 {
		return time.Duration(millis(lc.lease)) * time.Millisecond, false
	}
	return time.Duration(millis(c.cfg.watchdog)) * time.Millisecond, true
}
