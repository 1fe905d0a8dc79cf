package dlock_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/scripts"
)

// WithSyncReplicas on a master with one replica (no sentinel): grants wait
// for the replica; a grant it does not acknowledge is given back. The
// failover trials are in sentinel_test.go.

// ackTimeout is the WAIT timeout of tests that expect the replica to
// acknowledge: long enough for a loaded machine under -race.
const ackTimeout = time.Second

// noAckTimeout is the WAIT timeout of tests whose replica is stopped.
const noAckTimeout = 100 * time.Millisecond

// replicated is a master with one replica, and clients of both.
type replicated struct {
	t                *testing.T
	master, replica  *redistest.Server
	probe, onReplica *redis.Client
}

func newReplicated(t *testing.T) *replicated {
	master, replica := redistest.Replicated(t)
	return &replicated{t: t, master: master, replica: replica, probe: master.NewClient(t), onReplica: replica.NewClient(t)}
}

// client returns a Client on the master, with a counter of what it sends.
func (r *replicated) client(opts ...dlock.Option) (*dlock.Client, *counter) {
	cnt := newCounter()
	rdb := redis.NewClient(&redis.Options{Addr: r.master.Addr})
	rdb.AddHook(cnt)
	c := dlock.New(rdb, opts...)
	r.t.Cleanup(func() { _ = c.Close(); _ = rdb.Close() })
	return c, cnt
}

// stopReplica stops the replica's process (SIGSTOP) until the test ends or
// resume is called: it then neither applies nor acknowledges anything.
func (r *replicated) stopReplica() (resume func()) {
	p := r.replica.Process()
	require.NoError(r.t, p.Signal(syscall.SIGSTOP))
	resumed := false
	resume = func() {
		if !resumed {
			resumed = true
			_ = p.Signal(syscall.SIGCONT)
		}
	}
	r.t.Cleanup(resume)
	return resume
}

// onReplicaNow returns lock n's holder and token as the replica has them.
func (r *replicated) onReplicaNow(n string) (holder, token string) {
	v, err := r.onReplica.HMGet(context.Background(), key(n), "o", "f").Result()
	require.NoError(r.t, err)
	holder, _ = v[0].(string)
	token, _ = v[1].(string)
	return holder, token
}

func requireNotReplicated(t *testing.T, err error) {
	t.Helper()
	require.Error(t, err)
	assert.ErrorIs(t, err, dlock.ErrNotReplicated)
	assert.ErrorIs(t, err, dlock.ErrNotObtained, "the caller does not hold")
}

func TestSyncReplicas_BadSettings_EveryCallErrInvalidAndNothingSent(t *testing.T) {
	e := sharedEnv(t)
	ctx := ctxTimeout(t, 10*time.Second)
	for _, bad := range []struct {
		replicas int
		timeout  time.Duration
	}{{0, time.Second}, {-1, time.Second}, {1, 0}, {1, -time.Millisecond}, {1, 3 * time.Second}} {
		cnt := newCounter()
		c := e.client(e.rdb(cnt), dlock.WithSyncReplicas(bad.replicas, bad.timeout))
		err := c.Mutex(name(t)).Lock(ctx)
		assert.ErrorIs(t, err, dlock.ErrInvalid, "%d replicas within %v", bad.replicas, bad.timeout)
		_, err = c.Semaphore(name(t)).TryAcquire(ctx, 1)
		assert.ErrorIs(t, err, dlock.ErrInvalid)
		assert.Zero(t, cnt.total(), "nothing sent")
	}
	// 3s is over half of go-redis's default 5s read timeout (above); with a
	// longer read timeout it is fine, and with no replica, not acknowledged.
	rdb := redis.NewClient(&redis.Options{Addr: e.srv.Addr, ReadTimeout: 10 * time.Second})
	t.Cleanup(func() { _ = rdb.Close() })
	c := e.client(rdb, dlock.WithSyncReplicas(1, 20*time.Millisecond))
	requireNotReplicated(t, c.Mutex(name(t)).Lock(ctx))
}

func TestSyncReplicas_Lock_GrantOnReplicaWhenLockReturns(t *testing.T) {
	r := newReplicated(t)
	ctx := ctxTimeout(t, time.Minute)
	n := name(t)
	c, cnt := r.client(dlock.WithSyncReplicas(1, ackTimeout))
	m := c.Mutex(n)
	require.NoError(t, m.Lock(ctx)) // warm the script cache
	require.NoError(t, m.Unlock(ctx))
	cnt.reset()
	const rounds = 300
	for i := range rounds {
		require.NoError(t, m.Lock(ctx))
		holder, token := r.onReplicaNow(n)
		require.Equal(t, holderOf(t, r.probe, n), holder, "round %d: the replica has the grant when Lock returns", i)
		require.Equal(t, strconv.FormatUint(m.Token(), 10), token, "round %d: and its fencing token", i)
		require.NoError(t, m.Unlock(ctx))
	}
	_, cmds := cnt.snapshot()
	assert.Equal(t, rounds, cmds["wait"], "one WAIT per Lock, none per Unlock")

	// Without the option, a replica read right after Lock may lag behind.
	plain, _ := r.client()
	pm := plain.Mutex(n)
	missed := 0
	for range rounds {
		require.NoError(t, pm.Lock(ctx))
		if holder, _ := r.onReplicaNow(n); holder != holderOf(t, r.probe, n) {
			missed++
		}
		require.NoError(t, pm.Unlock(ctx))
	}
	t.Logf("without WithSyncReplicas, the replica lacked the grant when Lock returned in %d of %d rounds", missed, rounds)
}

func TestSyncReplicas_ReplicaStopped_LockFailsAndLeavesNothingHeld(t *testing.T) {
	r := newReplicated(t)
	ctx := ctxTimeout(t, 30*time.Second)
	n := name(t)
	c, _ := r.client(dlock.WithSyncReplicas(1, noAckTimeout))
	other, _ := r.client()
	m := c.Mutex(n)
	// Warm up (scripts cached, connections up) until the replica, just
	// synced and on a loaded machine, acknowledges within noAckTimeout.
	require.Eventually(t, func() bool {
		if m.Lock(ctx) != nil {
			return false
		}
		require.NoError(t, m.Unlock(ctx))
		return true
	}, 10*time.Second, 10*time.Millisecond, "the replica acknowledges once in sync")
	r.stopReplica()

	start := time.Now()
	err := m.Lock(ctx)
	took := time.Since(start)
	requireNotReplicated(t, err)
	assert.GreaterOrEqual(t, took, noAckTimeout, "WAIT waited its timeout")
	assert.Less(t, took, noAckTimeout+time.Second, "then Lock gave up at once")
	assert.Zero(t, m.Token(), "no hold on the handle")
	assert.Nil(t, m.Lost())
	assertReleased(t, r.probe, n)
	ok, err := other.Mutex(n).TryLock(ctx)
	require.NoError(t, err)
	assert.True(t, ok, "another Client takes the lock at once")

	ok, err = c.Mutex(name(t)).TryLock(ctx)
	assert.False(t, ok)
	requireNotReplicated(t, err)
}

func TestSyncReplicas_Handover_WaiterReturnsAfterItsWait(t *testing.T) {
	r := newReplicated(t)
	ctx := ctxTimeout(t, 30*time.Second)
	n := name(t)
	hc, _ := r.client(dlock.WithSyncReplicas(1, ackTimeout))
	wc, wcnt := r.client(dlock.WithSyncReplicas(1, ackTimeout))
	holder, waiter := hc.Mutex(n), wc.Mutex(n)
	require.NoError(t, holder.Lock(ctx))
	done := queueUp(t, ctx, r.probe, n, waiter, 1)
	// Count what the hand-over costs from when the waiter is quiet: its
	// queueing try and WAIT are in, and so is the look it takes once its
	// subscription is confirmed (nothing sent for 100ms).
	last, quietSince := -1, time.Now()
	require.Eventually(t, func() bool {
		if n := wcnt.total(); n != last {
			last, quietSince = n, time.Now()
		}
		_, cmds := wcnt.snapshot()
		return cmds["wait"] >= 1 && time.Since(quietSince) >= 100*time.Millisecond
	}, 10*time.Second, 5*time.Millisecond, "the waiter queued and quiet")
	wcnt.reset()
	start := time.Now()
	require.NoError(t, holder.Unlock(ctx))
	within(t, done, 5*time.Second, "the waiter acquiring")
	t.Logf("handed over in %v", time.Since(start))
	got, token := r.onReplicaNow(n)
	assert.True(t, strings.HasPrefix(got, wc.ID()+"."), "the replica names the waiter when its Lock returns: %q", got)
	assert.Equal(t, strconv.FormatUint(waiter.Token(), 10), token)
	_, cmds := wcnt.snapshot()
	assert.Equal(t, 1, cmds["evalsha:"+scripts.ExclTry.Hash()], "the waiter claims the hand-over with one try")
	assert.Equal(t, 1, cmds["wait"], "followed by WAIT")
	require.NoError(t, waiter.Unlock(ctx))
}

func TestSyncReplicas_Handover_ReplicaStopped_WaiterFailsAndLockPassesOn(t *testing.T) {
	r := newReplicated(t)
	ctx := ctxTimeout(t, 30*time.Second)
	n := name(t)
	hc, _ := r.client()
	wc, _ := r.client(dlock.WithSyncReplicas(1, noAckTimeout))
	nc, _ := r.client()
	holder, waiter, next := hc.Mutex(n), wc.Mutex(n), nc.Mutex(n)
	require.NoError(t, holder.Lock(ctx))
	failed := make(chan error, 1)
	go func() { failed <- waiter.Lock(ctx) }()
	require.Eventually(t, func() bool { return len(queued(t, r.probe, n)) == 1 }, 5*time.Second, time.Millisecond)
	nextDone := queueUp(t, ctx, r.probe, n, next, 2)
	r.stopReplica()

	require.NoError(t, holder.Unlock(ctx))
	select {
	case err := <-failed:
		requireNotReplicated(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter's Lock did not return")
	}
	assert.Zero(t, waiter.Token())
	within(t, nextDone, 5*time.Second, "the lock passing on to the next waiter")
	assert.True(t, strings.HasPrefix(holderOf(t, r.probe, n), nc.ID()+"."), "the next waiter holds it")
	require.NoError(t, next.Unlock(ctx))
	assertReleased(t, r.probe, n)
}

// TestSyncReplicas_EveryPrimitive_GrantsWaitAndUnacknowledgedGiveBack runs
// every kind of grant with the replica up (each reaches it) and stopped
// (each fails and leaves the state as it was).
func TestSyncReplicas_EveryPrimitive_GrantsWaitAndUnacknowledgedGiveBack(t *testing.T) {
	r := newReplicated(t)
	ctx := dlock.WithNewOwner(ctxTimeout(t, time.Minute))
	up, _ := r.client(dlock.WithSyncReplicas(1, ackTimeout))
	down, _ := r.client(dlock.WithSyncReplicas(1, noAckTimeout))
	rn, wn, sn := name(t), name(t), name(t)

	rm := up.ReentrantMutex(rn)
	require.NoError(t, rm.Lock(ctx))
	require.NoError(t, rm.Lock(ctx))
	rw := up.RWMutex(wn)
	require.NoError(t, rw.RLock(ctx))
	require.NoError(t, rw.RUnlock(ctx))
	require.NoError(t, rw.Lock(ctx))
	s := up.Semaphore(sn)
	_, err := s.TrySetPermits(ctx, 3)
	require.NoError(t, err)
	p, err := s.Acquire(ctx, 1)
	require.NoError(t, err)
	count, err := r.onReplica.HGet(ctx, key(rn), "n").Result()
	require.NoError(t, err)
	assert.Equal(t, "2", count, "the re-entry reached the replica")
	assert.NotEmpty(t, r.onReplica.HGet(ctx, key(wn), "o").Val(), "the write lock reached the replica")
	assert.EqualValues(t, 1, r.onReplica.ZCard(ctx, key(sn)+":h").Val(), "the permit reached the replica")

	r.stopReplica()
	requireNotReplicated(t, rm.Lock(ctx)) // a re-entry
	n, err := rm.HoldCount(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, n, "the unacknowledged re-entry was given back")
	requireNotReplicated(t, down.ReentrantMutex(name(t)).Lock(ctx))
	other := dlock.WithNewOwner(ctx)
	requireNotReplicated(t, down.RWMutex(name(t)).RLock(other))
	requireNotReplicated(t, down.RWMutex(name(t)).Lock(other))
	_, err = down.Semaphore(sn).Acquire(ctx, 1)
	requireNotReplicated(t, err)
	_, err = down.Semaphore(sn).Drain(ctx)
	requireNotReplicated(t, err)
	free, err := s.Available(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, free, "the permits given back")
	require.NoError(t, p.Release(ctx))
	require.NoError(t, rw.Unlock(ctx))
	require.NoError(t, rm.Unlock(ctx))
	require.NoError(t, rm.Unlock(ctx))
}

func TestSyncReplicas_Off_LockUnlockSendsWhatItAlwaysDid(t *testing.T) {
	r := newReplicated(t)
	ctx := context.Background()
	for _, on := range []bool{false, true} {
		var opts []dlock.Option
		if on {
			opts = append(opts, dlock.WithSyncReplicas(1, ackTimeout))
		}
		c, cnt := r.client(opts...)
		m := c.Mutex(name(t))
		require.NoError(t, m.Lock(ctx)) // warm the script cache
		require.NoError(t, m.Unlock(ctx))
		warmedUp(t, cnt)
		cnt.reset()
		const pairs = 20
		for range pairs {
			require.NoError(t, m.Lock(ctx))
			require.NoError(t, m.Unlock(ctx))
		}
		trips, cmds := cnt.snapshot()
		delete(cmds, "hello") // a connection dialled meanwhile
		delete(cmds, "client")
		want := map[string]int{
			"evalsha":                              2 * pairs,
			"evalsha:" + scripts.ExclTry.Hash():    pairs,
			"evalsha:" + scripts.ExclUnlock.Hash(): pairs,
		}
		if on {
			want["wait"] = pairs // in the Lock's pipeline: no extra round trip
		}
		assert.Equal(t, want, cmds, "WithSyncReplicas %v", on)
		assert.Equal(t, 2*pairs, trips, "WithSyncReplicas %v: one round trip per call", on)
	}
}

// BenchmarkMutex_LockUnlock_SyncReplicas measures what the option costs a
// Lock+Unlock pair on a master with one replica, both on loopback.
func BenchmarkMutex_LockUnlock_SyncReplicas(b *testing.B) {
	master, _ := redistest.Replicated(b)
	for _, on := range []bool{false, true} {
		b.Run("sync="+strconv.FormatBool(on), func(b *testing.B) {
			var opts []dlock.Option
			if on {
				opts = append(opts, dlock.WithSyncReplicas(1, time.Second))
			}
			rdb := master.NewClient(b)
			c := dlock.New(rdb, opts...)
			defer c.Close()
			m := c.Mutex("bench-sync-" + strconv.FormatBool(on))
			ctx := context.Background()
			for b.Loop() {
				if err := m.Lock(ctx); err != nil {
					b.Fatal(err)
				}
				if err := m.Unlock(ctx); err != nil && !errors.Is(err, dlock.ErrLost) {
					b.Fatal(err)
				}
			}
		})
	}
}
