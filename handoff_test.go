package dlock_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/scripts"
)

// The exclusive lock's queue (internal/scripts/excl_common.lua): blocked Locks queue
// in Redis and a release hands the lock straight to the first live waiter.

func queueKeys(n string) []string {
	k := key(n)
	return []string{k, k + ":mq", k + ":mqe", k + ":f", k + ":rl", k + ":ch"}
}

// holderOf returns the ID that holds lock n, "" when free.
func holderOf(t *testing.T, rdb *redis.Client, n string) string {
	t.Helper()
	id, err := rdb.HGet(context.Background(), key(n), "o").Result()
	if errors.Is(err, redis.Nil) {
		return ""
	}
	require.NoError(t, err)
	return id
}

// assertReleased checks that lock n is free and nothing of its queue is
// left; its key may keep the last fencing token for a minute.
func assertReleased(t *testing.T, rdb *redis.Client, n string) {
	t.Helper()
	ctx := context.Background()
	assert.Empty(t, holderOf(t, rdb, n), "nobody holds the lock")
	assert.Zero(t, rdb.Exists(ctx, queueKeys(n)[1:3]...).Val(), "nothing left of the queue")
	if ttl := rdb.PTTL(ctx, key(n)).Val(); ttl != -2*time.Nanosecond {
		assert.LessOrEqual(t, ttl, time.Minute, "the key keeps its last token for a minute at most")
		assert.Positive(t, ttl, "the key expires")
	}
}

// setHolder makes id hold mutex n for ttl, as a Client that then vanishes
// would leave it.
func setHolder(t *testing.T, rdb *redis.Client, n, id string, ttl time.Duration) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, rdb.HSet(ctx, key(n), "k", "mutex", "o", id, "n", 1, "f", 1).Err())
	require.NoError(t, rdb.PExpire(ctx, key(n), ttl).Err())
}

// queued returns the waiters queued on lock n ("<lease>:<id>"), first first.
func queued(t *testing.T, rdb *redis.Client, n string) []string {
	t.Helper()
	ids, err := rdb.ZRange(context.Background(), queueKeys(n)[1], 0, -1).Result()
	require.NoError(t, err)
	return ids
}

// queueUp starts m.Lock in the background and returns once the lock's queue
// in Redis holds want waiters; the channel closes when Lock succeeded.
func queueUp(t *testing.T, ctx context.Context, probe *redis.Client, n string, m *dlock.Mutex, want int) <-chan struct{} {
	t.Helper()
	done := lockInBackground(t, ctx, m, nil)
	require.Eventually(t, func() bool { return len(queued(t, probe, n)) == want }, 5*time.Second, time.Millisecond)
	return done
}

// lockInBackground starts m.Lock and returns a channel closed when it
// returned without error.
func lockInBackground(t *testing.T, ctx context.Context, m *dlock.Mutex, onDone func()) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		if assert.NoError(t, m.Lock(ctx)) && onDone != nil {
			onDone()
		}
	}()
	return done
}

func TestMutexQueue_ServesWaitersInArrivalOrderAcrossClients(t *testing.T) {
	e := sharedEnv(t)
	probe := e.rdb()
	n := name(t)
	ctx := ctxTimeout(t, 30*time.Second)
	a, b, c := e.client(e.rdb()), e.client(e.rdb()), e.client(e.rdb())
	// Without cohorting: a hold of b's would otherwise go first to b's
	// other waiter, within the cohort's bound (see the cohort tests).
	holder := a.Mutex(n, dlock.WithoutCohort())
	require.NoError(t, holder.Lock(ctx))

	var mu sync.Mutex
	var order []string
	var dones []<-chan struct{}
	// Queue five waiters on alternating Clients, one at a time, so their
	// arrival order is known.
	for i, cl := range []*dlock.Client{b, c, a, c, b} {
		label := string(rune('1' + i))
		m := cl.Mutex(n, dlock.WithoutCohort())
		dones = append(dones, lockInBackground(t, ctx, m, func() {
			mu.Lock()
			order = append(order, label)
			mu.Unlock()
			time.Sleep(5 * time.Millisecond)
			assert.NoError(t, m.Unlock(ctx))
		}))
		require.Eventually(t, func() bool { return len(queued(t, probe, n)) == i+1 },
			5*time.Second, time.Millisecond, "waiter %s queued", label)
	}
	require.NoError(t, holder.Unlock(ctx))
	for _, d := range dones {
		within(t, d, 10*time.Second, "every waiter served")
	}
	assert.Equal(t, []string{"1", "2", "3", "4", "5"}, order, "served in arrival order, whichever Client")
	assertReleased(t, probe, n)
}

func TestMutexQueue_HandedLock_WaiterSendsNothing(t *testing.T) {
	e := sharedEnv(t)
	probe := e.rdb()
	n := name(t)
	ctx := ctxTimeout(t, 30*time.Second)
	holder := e.client(e.rdb()).Mutex(n)
	cnt := newCounter()
	wc := e.client(e.rdb(cnt))
	waiter := wc.Mutex(n)
	require.NoError(t, holder.Lock(ctx))
	done := queueUp(t, ctx, probe, n, waiter, 1)
	time.Sleep(20 * time.Millisecond) // let the queueing try's reply arrive
	cnt.reset()
	require.NoError(t, holder.Unlock(ctx))
	within(t, done, 5*time.Second, "the waiter acquiring")
	_, cmds := cnt.snapshot()
	assert.Empty(t, cmds, "the waiter learns it holds the lock from the release message alone")
	assert.True(t, strings.HasPrefix(holderOf(t, probe, n), wc.ID()+"."), "the key names the waiter")
	pttl := probe.PTTL(ctx, key(n)).Val()
	assert.Greater(t, pttl, 5*time.Second, "the handed hold keeps what remained of the waiter's 10s mark")
	assert.LessOrEqual(t, pttl, 10*time.Second, "the handed hold keeps what remained of the waiter's 10s mark")
	require.NoError(t, waiter.Unlock(ctx))
	assertReleased(t, probe, n)
}

func TestMutexQueue_HandedHold_RenewedLikeAnyOther(t *testing.T) {
	long(t)
	e := sharedEnv(t)
	probe := e.rdb()
	n := name(t)
	ctx := ctxTimeout(t, 30*time.Second)
	const timeout = 900 * time.Millisecond
	holder := e.client(e.rdb(), dlock.WithWatchdogTimeout(timeout)).Mutex(n)
	waiter := e.client(e.rdb(), dlock.WithWatchdogTimeout(timeout)).Mutex(n)
	require.NoError(t, holder.Lock(ctx))
	done := lockInBackground(t, ctx, waiter, nil)
	// Queued for several mark renewals before the handoff.
	time.Sleep(1500 * time.Millisecond)
	require.Len(t, queued(t, probe, n), 1, "the waiter's mark renewed while it waits")
	require.NoError(t, holder.Unlock(ctx))
	within(t, done, 5*time.Second, "the waiter acquiring")
	lost := waiter.Lost()
	time.Sleep(3 * timeout)
	select {
	case <-lost:
		t.Fatal("a handed hold was reported lost while its Client renews it")
	default:
	}
	pttl := probe.PTTL(ctx, key(n)).Val()
	assert.Greater(t, pttl, time.Duration(0))
	assert.LessOrEqual(t, pttl, timeout)
	require.NoError(t, waiter.Unlock(ctx))
}

func TestMutexQueue_WithLeaseWaiter_HandedLockGetsItsOwnLease(t *testing.T) {
	e := sharedEnv(t)
	probe := e.rdb()
	n := name(t)
	ctx := ctxTimeout(t, 30*time.Second)
	holder := e.client(e.rdb()).Mutex(n)
	waiter := e.client(e.rdb()).Mutex(n, dlock.WithLease(2*time.Second))
	require.NoError(t, holder.Lock(ctx))
	done := queueUp(t, ctx, probe, n, waiter, 1)
	require.NoError(t, holder.Unlock(ctx))
	within(t, done, 5*time.Second, "the waiter acquiring")
	pttl := probe.PTTL(ctx, key(n)).Val()
	assert.Greater(t, pttl, 1500*time.Millisecond)
	assert.LessOrEqual(t, pttl, 2*time.Second, "the lease asked for, not the waiting mark's")
	require.NoError(t, waiter.Unlock(ctx))
}

// addGhost queues a waiter that no Client serves, as a crashed process
// leaves behind, whose mark expires after mark.
func addGhost(t *testing.T, rdb *redis.Client, n, token string, mark time.Duration) {
	t.Helper()
	ctx := context.Background()
	now, err := rdb.Time(ctx).Result()
	require.NoError(t, err)
	ks := queueKeys(n)
	member := "0:" + token // renewed by a watchdog, had it one
	require.NoError(t, rdb.ZAdd(ctx, ks[1], redis.Z{Score: float64(now.UnixMicro()), Member: member}).Err())
	require.NoError(t, rdb.ZAdd(ctx, ks[2], redis.Z{Score: float64(now.Add(mark).UnixMilli()), Member: member}).Err())
}

func TestMutexQueue_GhostWithExpiredMark_IsSkipped(t *testing.T) {
	e := sharedEnv(t)
	probe := e.rdb()
	n := name(t)
	ctx := ctxTimeout(t, 30*time.Second)
	holder := e.client(e.rdb()).Mutex(n)
	waiter := e.client(e.rdb()).Mutex(n)
	require.NoError(t, holder.Lock(ctx))
	addGhost(t, probe, n, "ghost.1", 200*time.Millisecond)
	done := queueUp(t, ctx, probe, n, waiter, 2)
	time.Sleep(300 * time.Millisecond) // the ghost's mark runs out
	require.NoError(t, holder.Unlock(ctx))
	d := within(t, done, 5*time.Second, "the live waiter acquiring")
	assert.Less(t, d, time.Second, "handed at once, past the dead entry")
	assert.Empty(t, queued(t, probe, n))
	require.NoError(t, waiter.Unlock(ctx))
}

func TestMutexQueue_GhostWithLiveMark_HoldsTheLockOnlyUntilItsMarkEnds(t *testing.T) {
	e := sharedEnv(t)
	probe := e.rdb()
	n := name(t)
	ctx := ctxTimeout(t, 30*time.Second)
	// Short leases so the live waiter's fallback timer is short too.
	holder := e.client(e.rdb(), dlock.WithWatchdogTimeout(time.Second)).Mutex(n)
	waiter := e.client(e.rdb(), dlock.WithWatchdogTimeout(time.Second)).Mutex(n)
	require.NoError(t, holder.Lock(ctx))
	const ghostMark = 800 * time.Millisecond
	addGhost(t, probe, n, "ghost.2", ghostMark)
	done := queueUp(t, ctx, probe, n, waiter, 2)
	released := time.Now()
	require.NoError(t, holder.Unlock(ctx))
	assert.Equal(t, "ghost.2", holderOf(t, probe, n), "handed to the first in line")
	within(t, done, 5*time.Second, "the live waiter acquiring once the ghost's lease ran out")
	waited := time.Since(released)
	assert.Greater(t, waited, ghostMark/2, "exclusion holds while the ghost's lease lasts")
	t.Logf("a dead waiter at the head held the lock up for %v (its mark had %v left)", waited, ghostMark)
	require.NoError(t, waiter.Unlock(ctx))
}

func TestMutexQueue_CancelAfterHandoff_PassesTheLockOn(t *testing.T) {
	e := sharedEnv(t)
	probe := e.rdb()
	n := name(t)
	ctx := ctxTimeout(t, 30*time.Second)
	c := e.client(e.rdb())
	holder := c.Mutex(n)
	wc := e.client(e.rdb())
	waiter := wc.Mutex(n)
	require.NoError(t, holder.Lock(ctx))
	addGhost(t, probe, n, "ghost.3", 20*time.Second)
	done := queueUp(t, ctx, probe, n, waiter, 2)
	require.NoError(t, holder.Unlock(ctx))
	require.Equal(t, "ghost.3", holderOf(t, probe, n))
	// The ghost gives up just after it was handed the lock.
	v, err := scripts.ExclCancel.Run(ctx, probe, queueKeys(n), "mutex", "0:ghost.3", c.ID(), "0").Slice()
	require.NoError(t, err)
	require.Len(t, v, 4, "passed on: %v", v)
	next, _ := v[1].(string)
	assert.True(t, strings.HasPrefix(next, wc.ID()+"."), "handed on to the next waiter, not %v", v)
	d := within(t, done, 5*time.Second, "the next waiter acquiring")
	assert.Less(t, d, time.Second)
	require.NoError(t, waiter.Unlock(ctx))
}

func TestMutexQueue_GivenUpWaiter_LeavesNothingBehind(t *testing.T) {
	e := sharedEnv(t)
	probe := e.rdb()
	n := name(t)
	ctx := ctxTimeout(t, 30*time.Second)
	holder := e.client(e.rdb()).Mutex(n)
	waiter := e.client(e.rdb()).Mutex(n)
	require.NoError(t, holder.Lock(ctx))
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	err := waiter.Lock(short)
	require.ErrorIs(t, err, dlock.ErrNotObtained)
	assert.Zero(t, probe.Exists(ctx, queueKeys(n)[1:3]...).Val(), "the queue entry was withdrawn")
	require.NoError(t, holder.Unlock(ctx))
	assertReleased(t, probe, n) // the release found nobody to hand the lock to
}

func TestMutexQueue_UncontendedUnlock_PublishesNothing(t *testing.T) {
	e := realEnv(t) // its own server: commandstats count only this test
	rdb := e.rdb()
	m := e.client(rdb).Mutex(name(t))
	ctx := ctxTimeout(t, 30*time.Second)
	publishes := func() int { return cmdCalls(t, rdb, "publish") }
	before := publishes()
	for range 20 {
		require.NoError(t, m.Lock(ctx))
		require.NoError(t, m.Unlock(ctx))
	}
	assert.Equal(t, before, publishes(), "nobody queued, so no release message")
}

// cmdCalls returns how many times the server ran cmd (INFO commandstats).
func cmdCalls(t *testing.T, rdb *redis.Client, cmd string) int {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	require.NoError(t, err)
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":calls="); ok {
			n := 0
			for _, ch := range rest {
				if ch < '0' || ch > '9' {
					break
				}
				n = n*10 + int(ch-'0')
			}
			return n
		}
	}
	return 0
}

func TestMutexQueue_HandoffWithinOneClient_PublishesNothing(t *testing.T) {
	e := realEnv(t) // its own server: commandstats count only this test
	rdb := e.rdb()
	c := e.client(rdb)
	n := name(t)
	ctx := ctxTimeout(t, 30*time.Second)
	holder, waiter := c.Mutex(n), c.Mutex(n)
	require.NoError(t, holder.Lock(ctx))
	done := queueUp(t, ctx, rdb, n, waiter, 1)
	before := cmdCalls(t, rdb, "publish")
	require.NoError(t, holder.Unlock(ctx))
	within(t, done, time.Second, "the waiter on the same Client acquiring")
	assert.Equal(t, before, cmdCalls(t, rdb, "publish"), "the releasing Client wakes its own waiter")
	require.NoError(t, waiter.Unlock(ctx))
}

func TestMutexQueue_TryFindingTheLockFree_HandsItToTheFirstLocalWaiter(t *testing.T) {
	e := sharedEnv(t)
	probe := e.rdb()
	n := name(t)
	ctx := ctxTimeout(t, 30*time.Second)
	c := e.client(e.rdb())
	// A holder that will vanish without a release, as a crashed one does;
	// its 20s lease sets the waiter's fallback timer far away.
	setHolder(t, probe, n, "gone.1", 20*time.Second)
	first := c.Mutex(n)
	done := queueUp(t, ctx, probe, n, first, 1)
	require.NoError(t, probe.HDel(ctx, key(n), "o", "n").Err()) // the lease "runs out"
	// A TryLock through the same Client finds the lock free but someone
	// queued: the script hands it to that waiter, publishing nothing, and
	// this Client wakes it.
	ok, err := c.Mutex(n).TryLock(ctx)
	require.NoError(t, err)
	assert.False(t, ok, "a TryLock does not jump the queue")
	within(t, done, time.Second, "the queued waiter acquiring, long before its 20s timer")
	require.NoError(t, first.Unlock(ctx))
}

// A release that hands the lock to the first waiter takes excl_unlock's
// handoff path when that waiter's mark is live, and the slow path when a
// dead mark is ahead of it (which the slow path purges): both leave the
// same state, but for marks expired behind the first waiter, which the
// handoff path leaves for the next slow path. The new holder has count 1, the token after the old one and
// its reservation (seeded ahead of the clock), the queue hint, the reservation it asked for, the token
// memory, a lease no longer than its mark; the waiter is out of the queue
// and holds from the message. INFO commandstats tells the paths apart:
// only the slow path purges (ZRANGEBYSCORE).
func TestRelease_HandoffPath_LeavesWhatTheSlowPathLeaves(t *testing.T) {
	e := realEnv(t)
	rdb := e.rdb()
	ctx := ctxTimeout(t, 20*time.Second)
	a, b := e.client(e.rdb()), e.client(e.rdb())
	type handle struct {
		lock, unlock func() error
		token        func() uint64
	}
	mutex := func(c *dlock.Client, n string) handle {
		m := c.Mutex(n)
		return handle{func() error { return m.Lock(ctx) }, func() error { return m.Unlock(ctx) }, m.Token}
	}
	reentrant := func(c *dlock.Client, n string) handle {
		m, octx := c.ReentrantMutex(n), dlock.WithNewOwner(ctx)
		return handle{func() error { return m.Lock(octx) }, func() error { return m.Unlock(octx) }, func() uint64 { return m.Token(octx) }}
	}
	type outcome struct {
		fields            map[string]string // of K, with f and o replaced by what they must be
		memoryIsToken     bool
		tokenPastReserved bool
		leaseWithinMark   bool
		queued            int64
		purged            bool
	}
	run := func(t *testing.T, mk func(*dlock.Client, string) handle, deadAhead bool) outcome {
		n := name(t)
		h, w := mk(a, n), mk(b, n)
		require.NoError(t, h.lock())
		// A token an hour ahead of the clock with 7 reserved after it, so
		// that the next token must follow them, not the clock.
		seeded := h.token() + uint64(time.Hour/time.Microsecond)
		require.NoError(t, rdb.HSet(ctx, key(n), "f", seeded, "x", 7).Err())
		got := make(chan error, 1)
		go func() { got <- w.lock() }()
		waitQueued(t, e, n, 1)
		// Its try again once subscribed purges too: let it pass first.
		require.Eventually(t, func() bool { return dlock.LocalWaiters(b) == 1 }, 5*time.Second, time.Millisecond)
		time.Sleep(50 * time.Millisecond)
		ks := queueKeys(n)
		if deadAhead {
			require.NoError(t, rdb.ZAdd(ctx, ks[1], redis.Z{Score: 1, Member: "0:dead.x"}).Err())
			require.NoError(t, rdb.ZAdd(ctx, ks[2], redis.Z{Score: 1, Member: "0:dead.x"}).Err())
		}
		before := cmdCalls(t, rdb, "zrangebyscore")
		require.NoError(t, h.unlock())
		require.NoError(t, <-got)
		var o outcome
		o.purged = cmdCalls(t, rdb, "zrangebyscore") > before
		tok := w.token()
		fields, err := rdb.HGetAll(ctx, key(n)).Result()
		require.NoError(t, err)
		o.tokenPastReserved = tok == seeded+7+1 && fields["f"] == strconv.FormatUint(tok, 10)
		memory := rdb.Get(ctx, ks[3]).Val()
		o.memoryIsToken = memory == fields["f"] || memory == fields["f"]+"+"+fields["x"]
		o.fields = map[string]string{"k": fields["k"], "n": fields["n"], "q": fields["q"], "x": fields["x"],
			"o is the waiter's": strconv.FormatBool(holderOf(t, rdb, n) != "" && !strings.HasPrefix(fields["o"], "dead"))}
		pttl := rdb.PTTL(ctx, key(n)).Val()
		o.leaseWithinMark = pttl > 0 && pttl <= 10*time.Second // the mark lease: a third of the 30 s watchdog timeout
		o.queued = rdb.ZCard(ctx, ks[1]).Val()
		require.NoError(t, w.unlock())
		return o
	}
	for _, tc := range []struct {
		name string
		mk   func(*dlock.Client, string) handle
	}{{"Mutex", mutex}, {"ReentrantMutex", reentrant}} {
		t.Run(tc.name, func(t *testing.T) {
			fast, slow := run(t, tc.mk, false), run(t, tc.mk, true)
			assert.False(t, fast.purged, "the live first waiter was served by the slow path")
			assert.True(t, slow.purged, "a dead mark ahead was not purged")
			fast.purged, slow.purged = false, false
			assert.Equal(t, slow, fast)
			assert.True(t, fast.tokenPastReserved && fast.memoryIsToken && fast.leaseWithinMark, "%+v", fast)
			assert.Zero(t, fast.queued)
			assert.Equal(t, "1", fast.fields["n"])
			assert.Equal(t, "1", fast.fields["q"])
		})
	}
}

// An Unlock that would hand the lock on, with a key of another type where
// its queue should be, is refused with the key named, and writes nothing:
// the handoff path reads the queue before any write and leaves a bad key to
// the slow path, which names it.
func TestRelease_HandoffPath_ForeignQueueKey_NamedNothingWritten(t *testing.T) {
	e := realEnv(t)
	rdb := e.rdb()
	ctx := ctxTimeout(t, 10*time.Second)
	for _, q := range []struct{ suffix, found string }{{":mq", "list"}, {":mqe", "list"}} {
		t.Run(q.suffix, func(t *testing.T) {
			n := name(t)
			m := e.client(e.rdb()).Mutex(n)
			require.NoError(t, m.Lock(ctx))
			require.NoError(t, rdb.HSet(ctx, key(n), "q", "1").Err()) // as if a waiter had queued
			if q.suffix == ":mqe" {
				require.NoError(t, rdb.ZAdd(ctx, key(n)+":mq", redis.Z{Score: 1, Member: "0:x.y"}).Err())
			}
			bad := key(n) + q.suffix
			require.NoError(t, rdb.RPush(ctx, bad, "x").Err())
			refusedNamingKey(t, ctx, rdb, n, bad, q.found, func() error { return m.Unlock(ctx) })
		})
	}
}
