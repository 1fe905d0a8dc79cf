package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

func clusterClient(t *testing.T, addrs []string, hooks ...redis.Hook) *redis.ClusterClient {
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	for _, h := range hooks {
		rdb.AddHook(h)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

func TestCluster_MutexAndReentrant_ExcludeAndWakeAcrossNodes(t *testing.T) {
	long(t)
	addrs := redistest.Cluster(t, 3)
	ctx := ctxTimeout(t, time.Minute)
	check := clusterClient(t, addrs)
	clients := make([]*dlock.Client, 3)
	for i := range clients {
		clients[i] = dlock.New(clusterClient(t, addrs))
		t.Cleanup(func() { _ = clients[i].Close() })
	}
	// Names chosen to land on different nodes.
	names := []string{name(t) + "-a", name(t) + "-b", name(t) + "-c", name(t) + "-d"}
	var overlaps atomic.Int32
	var wg sync.WaitGroup
	const goroutines, rounds = 3, 10
	for _, n := range names {
		inside := []*atomic.Int32{new(atomic.Int32), new(atomic.Int32)} // per lock
		for _, c := range clients {
			for g := range goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var lock interface {
						Lock(context.Context) error
						Unlock(context.Context) error
					}
					lctx := ctx
					if g%2 == 0 {
						lock = c.Mutex(n)
					} else {
						r := c.ReentrantMutex(n+"-r", dlock.WithHandleOwner())
						lock, lctx = r, dlock.WithNewOwner(ctx)
					}
					counterKey := n + fmt.Sprint(g%2) + ":counter"
					for range rounds {
						require.NoError(t, lock.Lock(lctx))
						if inside[g%2].Add(1) != 1 {
							overlaps.Add(1)
						}
						v, err := check.Get(ctx, counterKey).Int()
						if err != nil && !errors.Is(err, redis.Nil) {
							t.Error(err)
						}
						require.NoError(t, check.Set(ctx, counterKey, v+1, time.Minute).Err())
						inside[g%2].Add(-1)
						require.NoError(t, lock.Unlock(lctx))
					}
				}()
			}
		}
	}
	wg.Wait()
	for _, n := range names {
		for kind := range 2 {
			got, err := check.Get(ctx, n+fmt.Sprint(kind)+":counter").Int()
			require.NoError(t, err)
			perKind := len(clients) * ((goroutines + 1 - kind) / 2) * rounds
			assert.Equal(t, perKind, got, "counter of %s kind %d", n, kind)
		}
	}
	assert.Zero(t, overlaps.Load())
}

func TestCluster_BlockedWaiter_WokenByPublishFromAnotherNode(t *testing.T) {
	addrs := redistest.Cluster(t, 3)
	ctx := ctxTimeout(t, 30*time.Second)
	holder := dlock.New(clusterClient(t, addrs))
	waiter := dlock.New(clusterClient(t, addrs))
	t.Cleanup(func() { _ = holder.Close(); _ = waiter.Close() })
	for i := range 6 { // several names, so some channels live off the waiter's pub/sub node
		n := fmt.Sprintf("%s-%d", name(t), i)
		h := holder.Mutex(n)
		require.NoError(t, h.Lock(ctx))
		done := make(chan struct{})
		go func() {
			defer close(done)
			assert.NoError(t, waiter.Mutex(n).Lock(ctx))
		}()
		time.Sleep(100 * time.Millisecond)
		released := time.Now()
		require.NoError(t, h.Unlock(ctx))
		// The 30s watchdog lease rules out the timer: only the release
		// message, published on the lock's node and broadcast by the
		// cluster, can wake the waiter this soon.
		within(t, done, 3*time.Second, "waiter woken on the cluster")
		t.Logf("handoff %d on the cluster: %v", i, time.Since(released))
	}
}

func TestCluster_Watchdog_RenewsHoldsOnEverySlot(t *testing.T) {
	long(t)
	addrs := redistest.Cluster(t, 3)
	cnt := newCounter()
	const timeout = 1500 * time.Millisecond
	c := dlock.New(clusterClient(t, addrs, cnt), dlock.WithWatchdogTimeout(timeout))
	t.Cleanup(func() { _ = c.Close() })
	ctx := ctxTimeout(t, time.Minute)
	locks := make([]*dlock.Mutex, 300)
	for i := range locks {
		locks[i] = c.Mutex(fmt.Sprintf("%s-%d", name(t), i))
		require.NoError(t, locks[i].Lock(ctx))
	}
	probe := clusterClient(t, addrs)
	time.Sleep(2 * timeout) // six periods; an unrenewed hold would have expired
	for _, m := range locks {
		select {
		case <-m.Lost():
			t.Fatal("a hold was lost on the cluster")
		default:
		}
	}
	d, err := probe.PTTL(ctx, key(locks[0].Name())).Result()
	require.NoError(t, err)
	assert.Positive(t, d)
	assert.LessOrEqual(t, d, timeout)
	// Renewals go per node, on the node clients, which the cluster client's
	// hook does not see: cluster_renew_test.go counts them.
	assert.Zero(t, renewCalls(cnt), "no renewal went per slot through the cluster client")
	for _, m := range locks {
		require.NoError(t, m.Unlock(ctx))
	}
}

func TestCluster_RWMutexSemaphoreLatch_WorkAcrossNodes(t *testing.T) {
	long(t)
	addrs := redistest.Cluster(t, 3)
	ctx := ctxTimeout(t, 30*time.Second)
	a := dlock.New(clusterClient(t, addrs), dlock.WithWatchdogTimeout(1500*time.Millisecond))
	b := dlock.New(clusterClient(t, addrs), dlock.WithWatchdogTimeout(1500*time.Millisecond))
	t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
	for i := range 3 { // names on different nodes
		n := fmt.Sprintf("%s-%d", name(t), i)

		rw := a.RWMutex(n, dlock.WithHandleOwner())
		require.NoError(t, rw.RLock(ctx))
		writer := make(chan struct{})
		go func() {
			defer close(writer)
			assert.NoError(t, b.RWMutex(n, dlock.WithHandleOwner()).Lock(ctx))
		}()
		time.Sleep(2 * time.Second) // more than a lease: only renewals keep the read hold
		select {
		case <-writer:
			t.Fatal("writer got in while the renewed reader held the lock")
		default:
		}
		require.NoError(t, rw.RUnlock(ctx))
		within(t, writer, 3*time.Second, "writer after the reader on the cluster")

		s := a.Semaphore(n + "-sem")
		_, err := s.TrySetPermits(ctx, 2)
		require.NoError(t, err)
		p, err := s.Acquire(ctx, 2)
		require.NoError(t, err)
		got := make(chan struct{})
		go func() {
			defer close(got)
			q, err := b.Semaphore(n+"-sem").Acquire(ctx, 1)
			if assert.NoError(t, err) {
				assert.NoError(t, q.Release(ctx))
			}
		}()
		time.Sleep(100 * time.Millisecond)
		require.NoError(t, p.Release(ctx))
		within(t, got, 3*time.Second, "semaphore waiter on the cluster")

		l := a.CountDownLatch(n + "-latch")
		_, err = l.TrySetCount(ctx, 1)
		require.NoError(t, err)
		awaited := make(chan struct{})
		go func() {
			defer close(awaited)
			assert.NoError(t, b.CountDownLatch(n+"-latch").Await(ctx))
		}()
		time.Sleep(100 * time.Millisecond)
		require.NoError(t, l.CountDown(ctx))
		within(t, awaited, 3*time.Second, "latch Await on the cluster")
	}
}
