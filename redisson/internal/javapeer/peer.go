// Package javapeer is a test-only stand-in for a Java process using
// Redisson 4.7.0: it sends what Redisson sends, with its own transcription
// of the scripts (scripts.go), names, holder fields <uuid>:<thread id>,
// unlock latch, watchdog (a batched renewal every third of the watchdog
// timeout, counted from the end of the previous pass) and waiting (try,
// subscribe, try, then wait for a message Redisson's LockPubSub,
// SemaphorePubSub or CountDownLatchPubSub would act on, or for the TTL).
// It exists so that package redisson's tests can check that Go and Java
// exclude, wake and renew each other, without a JVM. See docs/redisson.md.
package javapeer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrIllegalMonitorState is Java's IllegalMonitorStateException: an unlock
// by a thread that does not hold the lock.
var ErrIllegalMonitorState = errors.New("javapeer: IllegalMonitorStateException")

// Client is one emulated RedissonClient.
type Client struct {
	rdb      redis.UniversalClient
	ID       string        // the client UUID
	Sharded  bool          // shardingSupported: SPUBLISH/SSUBSCRIBE
	Watchdog time.Duration // lockWatchdogTimeout

	mu       sync.Mutex
	entries  map[entryKey]int // watchdog entries: re-entry counts per (name, field)
	leases   map[entryKey]time.Duration
	stop     chan struct{}
	done     chan struct{}
	started  bool
	Renewals int // renewal passes run
}

type entryKey struct {
	name, field string
	read        bool
}

// New returns a peer client with a random UUID.
func New(rdb redis.UniversalClient, sharded bool, watchdog time.Duration) *Client {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	id := fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
	if watchdog <= 0 {
		watchdog = 30 * time.Second
	}
	return &Client{rdb: rdb, ID: id, Sharded: sharded, Watchdog: watchdog,
		entries: map[entryKey]int{}, leases: map[entryKey]time.Duration{},
		stop: make(chan struct{}), done: make(chan struct{})}
}

// Close stops the watchdog, as a Redisson shutdown does; holds stay until
// their leases end.
func (c *Client) Close() {
	c.mu.Lock()
	started := c.started
	select {
	case <-c.stop:
	default:
		close(c.stop)
	}
	c.mu.Unlock()
	if started {
		<-c.done
	}
}

// Field is getLockName(threadId).
func (c *Client) Field(tid int64) string { return c.ID + ":" + strconv.FormatInt(tid, 10) }

func (c *Client) pub() string {
	if c.Sharded {
		return "SPUBLISH"
	}
	return "PUBLISH"
}

func prefixName(prefix, name string) string {
	if strings.Contains(name, "{") {
		return prefix + ":" + name
	}
	return prefix + ":{" + name + "}"
}

func suffixName(name, suffix string) string {
	if strings.Contains(name, "{") {
		return name + ":" + suffix
	}
	return "{" + name + "}:" + suffix
}

func msArg(d time.Duration) int64 { return d.Milliseconds() }

func latchKey(name string) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return prefixName("redisson_unlock_latch", name) + ":" + hex.EncodeToString(b[:])
}

// latchTTL is (timeout + retryDelay) * retryAttempts with the defaults.
const latchTTL = 16000

// lease returns the lease to send and whether the watchdog runs.
func (c *Client) lease(lease time.Duration) (time.Duration, bool) {
	if lease > 0 {
		return lease, false
	}
	return c.Watchdog, true
}

func (c *Client) register(k entryKey, lease time.Duration, watch bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.leases[k] = lease
	if !watch {
		return
	}
	c.entries[k]++
	if !c.started {
		c.started = true
		go c.watchdog()
	}
}

// cancel drops one re-entry of the watchdog entry (Java's
// cancelExpirationRenewal), or all of them.
func (c *Client) cancel(k entryKey, all bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := c.entries[k]; n > 1 && !all {
		c.entries[k] = n - 1
	} else {
		delete(c.entries, k)
	}
}

func (c *Client) watchdog() {
	defer close(c.done)
	t := time.NewTimer(c.Watchdog / 3)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		c.renewPass()
		t.Reset(c.Watchdog / 3)
	}
}

// RenewNow runs one watchdog pass at once (for tests).
func (c *Client) RenewNow() { c.renewPass() }

func (c *Client) renewPass() {
	c.mu.Lock()
	var locks, reads []entryKey
	for k := range c.entries {
		if k.read {
			reads = append(reads, k)
		} else {
			locks = append(locks, k)
		}
	}
	c.Renewals++
	c.mu.Unlock()
	ctx := context.Background()
	for _, k := range locks { // one per EVAL keeps cluster slots apart
		res, err := renew.Run(ctx, c.rdb, []string{k.name}, msArg(c.Watchdog), k.field).Int64Slice()
		if err == nil && len(res) == 1 && res[0] == 0 {
			c.cancel(k, true)
		}
	}
	for _, k := range reads {
		pfx := k.name
		if !strings.Contains(pfx, "{") {
			pfx = "{" + pfx + "}"
		}
		n, err := renewRead.Run(ctx, c.rdb, []string{k.name, pfx}, msArg(c.Watchdog), k.field).Int64()
		if err == nil && n == 0 {
			c.cancel(k, true)
		}
	}
}

// waitFor is the Java waiting loop: try once, subscribe, then try and
// wait for a message accepted by wake or the returned TTL (none when < 0),
// until done or ctx ends.
func (c *Client) waitFor(ctx context.Context, channel string, try func() (bool, int64, error), wake func(payload string) bool) error {
	ok, ttl, err := try()
	if err != nil || ok {
		return err
	}
	var ps *redis.PubSub
	if c.Sharded {
		ps = c.rdb.SSubscribe(ctx, channel)
	} else {
		ps = c.rdb.Subscribe(ctx, channel)
	}
	defer ps.Close()
	msgs := ps.ChannelWithSubscriptions()
	for subscribed := false; !subscribed; {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case m := <-msgs:
			_, subscribed = m.(*redis.Subscription)
		}
	}
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		if ok, ttl, err = try(); err != nil || ok {
			return err
		}
		t.Stop()
		var timeout <-chan time.Time
		if ttl >= 0 {
			t.Reset(time.Duration(ttl) * time.Millisecond)
			timeout = t.C
		}
	wait:
		for {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-timeout:
				break wait
			case m := <-msgs:
				if msg, ok := m.(*redis.Message); ok && wake(msg.Payload) {
					break wait
				}
			}
		}
	}
}

// lockWake is LockPubSub: only 0 and 1 wake a waiter.
func lockWake(p string) bool { return p == "0" || p == "1" }

// ---- RLock and RFencedLock ----

// TryLock is tryLock(0, lease) for thread tid: one attempt. lease <= 0
// uses the watchdog.
func (c *Client) TryLock(ctx context.Context, name string, tid int64, lease time.Duration) (bool, error) {
	ok, _, err := c.tryLockOnce(ctx, name, tid, lease)
	return ok, err
}

func (c *Client) tryLockOnce(ctx context.Context, name string, tid int64, lease time.Duration) (bool, int64, error) {
	l, watch := c.lease(lease)
	ttl, err := tryLock.Run(ctx, c.rdb, []string{name}, msArg(l), c.Field(tid)).Int64()
	if errors.Is(err, redis.Nil) {
		c.register(entryKey{name: name, field: c.Field(tid)}, l, watch)
		return true, 0, nil
	}
	return false, ttl, err
}

// Lock is lock(lease) for thread tid.
func (c *Client) Lock(ctx context.Context, name string, tid int64, lease time.Duration) error {
	return c.waitFor(ctx, prefixName("redisson_lock__channel", name), func() (bool, int64, error) {
		return c.tryLockOnce(ctx, name, tid, lease)
	}, lockWake)
}

// Unlock is unlock() for thread tid.
func (c *Client) Unlock(ctx context.Context, name string, tid int64) error {
	return c.unlockWith(ctx, unlock, entryKey{name: name, field: c.Field(tid)}, prefixName("redisson_lock__channel", name), 0)
}

func (c *Client) unlockWith(ctx context.Context, s *redis.Script, k entryKey, channel string, msg int) error {
	c.mu.Lock()
	l, ok := c.leases[k]
	c.mu.Unlock()
	if !ok {
		l = c.Watchdog
	}
	latch := latchKey(k.name)
	_, err := s.Run(ctx, c.rdb, []string{k.name, channel, latch}, msg, msArg(l), k.field, c.pub(), latchTTL).Int64()
	c.cancel(k, false)
	c.rdb.Del(ctx, latch)
	if errors.Is(err, redis.Nil) {
		return ErrIllegalMonitorState
	}
	return err
}

// ForceUnlock is forceUnlock().
func (c *Client) ForceUnlock(ctx context.Context, name string) (bool, error) {
	n, err := forceUnlock.Run(ctx, c.rdb, []string{name, prefixName("redisson_lock__channel", name)}, 0, c.pub()).Int64()
	return n == 1, err
}

// IsLocked is isLocked().
func (c *Client) IsLocked(ctx context.Context, name string) (bool, error) {
	n, err := c.rdb.Exists(ctx, name).Result()
	return n == 1, err
}

// HoldCount is getHoldCount() of thread tid.
func (c *Client) HoldCount(ctx context.Context, name string, tid int64) (int, error) {
	n, err := c.rdb.HGet(ctx, name, c.Field(tid)).Int()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	return n, err
}

// LockAndGetToken is RFencedLock.lockAndGetToken() for thread tid (always
// the watchdog, as Java's ignores a lease).
func (c *Client) LockAndGetToken(ctx context.Context, name string, tid int64) (int64, error) {
	var token int64
	err := c.waitFor(ctx, prefixName("redisson_lock__channel", name), func() (bool, int64, error) {
		res, err := tryLockFenced.Run(ctx, c.rdb, []string{name, prefixName("redisson_lock_token", name)}, msArg(c.Watchdog), c.Field(tid)).Int64Slice()
		if err != nil {
			return false, 0, err
		}
		if res[0] == -1 {
			token = res[1]
			c.register(entryKey{name: name, field: c.Field(tid)}, c.Watchdog, true)
			return true, 0, nil
		}
		return false, res[0], nil
	}, lockWake)
	return token, err
}

// ---- RReadWriteLock ----

func (c *Client) rwChannel(name string) string { return prefixName("redisson_rwlock", name) }

// ReadLock is readLock().lock(lease) for thread tid.
func (c *Client) ReadLock(ctx context.Context, name string, tid int64, lease time.Duration) error {
	return c.waitFor(ctx, c.rwChannel(name), func() (bool, int64, error) { return c.tryRead(ctx, name, tid, lease) }, lockWake)
}

// TryReadLock is readLock().tryLock(0, lease).
func (c *Client) TryReadLock(ctx context.Context, name string, tid int64, lease time.Duration) (bool, error) {
	ok, _, err := c.tryRead(ctx, name, tid, lease)
	return ok, err
}

func (c *Client) tryRead(ctx context.Context, name string, tid int64, lease time.Duration) (bool, int64, error) {
	l, watch := c.lease(lease)
	f := c.Field(tid)
	ttl, err := readLock.Run(ctx, c.rdb, []string{name, suffixName(name, f) + ":rwlock_timeout"}, msArg(l), f, f+":write").Int64()
	if errors.Is(err, redis.Nil) {
		c.register(entryKey{name: name, field: f, read: true}, l, watch)
		return true, 0, nil
	}
	return false, ttl, err
}

// ReadUnlock is readLock().unlock().
func (c *Client) ReadUnlock(ctx context.Context, name string, tid int64) error {
	f := c.Field(tid)
	k := entryKey{name: name, field: f, read: true}
	pfx := name
	if !strings.Contains(pfx, "{") {
		pfx = "{" + pfx + "}"
	}
	latch := latchKey(name)
	_, err := readUnlock.Run(ctx, c.rdb, []string{name, c.rwChannel(name), suffixName(name, f) + ":rwlock_timeout", pfx, latch}, 0, f, c.pub(), latchTTL).Int64()
	c.cancel(k, false)
	c.rdb.Del(ctx, latch)
	if errors.Is(err, redis.Nil) {
		return ErrIllegalMonitorState
	}
	return err
}

// WriteLock is writeLock().lock(lease) for thread tid.
func (c *Client) WriteLock(ctx context.Context, name string, tid int64, lease time.Duration) error {
	return c.waitFor(ctx, c.rwChannel(name), func() (bool, int64, error) { return c.tryWrite(ctx, name, tid, lease) }, lockWake)
}

// TryWriteLock is writeLock().tryLock(0, lease).
func (c *Client) TryWriteLock(ctx context.Context, name string, tid int64, lease time.Duration) (bool, error) {
	ok, _, err := c.tryWrite(ctx, name, tid, lease)
	return ok, err
}

func (c *Client) tryWrite(ctx context.Context, name string, tid int64, lease time.Duration) (bool, int64, error) {
	l, watch := c.lease(lease)
	f := c.Field(tid) + ":write"
	ttl, err := writeLock.Run(ctx, c.rdb, []string{name}, msArg(l), f).Int64()
	if errors.Is(err, redis.Nil) {
		c.register(entryKey{name: name, field: f}, l, watch)
		return true, 0, nil
	}
	return false, ttl, err
}

// WriteUnlock is writeLock().unlock().
func (c *Client) WriteUnlock(ctx context.Context, name string, tid int64) error {
	return c.unlockWith(ctx, writeUnlock, entryKey{name: name, field: c.Field(tid) + ":write"}, c.rwChannel(name), 1)
}

// ---- RSemaphore ----

func semChannel(name string) string { return prefixName("redisson_sc", name) }

// TrySetPermits is trySetPermits(n).
func (c *Client) TrySetPermits(ctx context.Context, name string, n int64) (bool, error) {
	r, err := semTrySet.Run(ctx, c.rdb, []string{name, semChannel(name)}, n, c.pub()).Int64()
	return r == 1, err
}

// TryAcquire is tryAcquire(n): one attempt.
func (c *Client) TryAcquire(ctx context.Context, name string, n int64) (bool, error) {
	r, err := semTryAcquire.Run(ctx, c.rdb, []string{name}, n).Int64()
	return r == 1, err
}

// Acquire is acquire(n): it wakes only on messages with a positive payload.
func (c *Client) Acquire(ctx context.Context, name string, n int64) error {
	return c.waitFor(ctx, semChannel(name), func() (bool, int64, error) {
		ok, err := c.TryAcquire(ctx, name, n)
		return ok, -1, err
	}, func(p string) bool {
		v, err := strconv.ParseInt(p, 10, 64)
		return err == nil && v > 0
	})
}

// Release is release(n).
func (c *Client) Release(ctx context.Context, name string, n int64) error {
	err := semRelease.Run(ctx, c.rdb, []string{name, semChannel(name)}, n, c.pub()).Err()
	if errors.Is(err, redis.Nil) {
		return nil
	}
	return err
}

// AvailablePermits is availablePermits().
func (c *Client) AvailablePermits(ctx context.Context, name string) (int64, error) {
	n, err := c.rdb.Get(ctx, name).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	return n, err
}

// ---- RCountDownLatch ----

func latchChannel(name string) string { return "redisson_countdownlatch__channel__{" + name + "}" }

// TrySetCount is trySetCount(n).
func (c *Client) TrySetCount(ctx context.Context, name string, n int64) (bool, error) {
	r, err := latchTrySet.Run(ctx, c.rdb, []string{name, latchChannel(name)}, 1, n, c.pub()).Int64()
	return r == 1, err
}

// CountDown is countDown().
func (c *Client) CountDown(ctx context.Context, name string) error {
	err := latchCountDown.Run(ctx, c.rdb, []string{name, latchChannel(name)}, 0, c.pub()).Err()
	if errors.Is(err, redis.Nil) {
		return nil
	}
	return err
}

// Count is getCount().
func (c *Client) Count(ctx context.Context, name string) (int64, error) {
	n, err := c.rdb.Get(ctx, name).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	return n, err
}

// Await is await(): it returns once the count is 0, re-reading it only on a
// 0 message.
func (c *Client) Await(ctx context.Context, name string) error {
	if n, err := c.Count(ctx, name); err != nil || n == 0 {
		return err
	}
	return c.waitFor(ctx, latchChannel(name), func() (bool, int64, error) {
		n, err := c.Count(ctx, name)
		return n == 0, -1, err
	}, func(p string) bool { return p == "0" })
}
