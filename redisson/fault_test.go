package redisson_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock/internal/faultnet"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/redisson"
	"github.com/dlock-go/dlock/redisson/internal/javapeer"
)

// A Go waiter whose connections are cut subscribes again (go-redis
// reconnects and resubscribes), retries on the confirmation, and is woken by
// a Java release that follows: it does not sit out the 15 s lease.
func TestLock_WaiterConnectionsDropped_StillWokenByJava(t *testing.T) {
	t.Parallel()
	srv := redistest.Real(t)
	proxy, err := faultnet.Start(srv.Addr)
	require.NoError(t, err)
	t.Cleanup(proxy.Close)
	direct := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = direct.Close() })
	viaProxy := redis.NewClient(&redis.Options{Addr: proxy.Addr})
	t.Cleanup(func() { _ = viaProxy.Close() })
	c := redisson.New(viaProxy)
	t.Cleanup(func() { _ = c.Close() })
	java := javapeer.New(direct, false, 0)
	t.Cleanup(java.Close)

	ctx := ctxT(t, 20*time.Second)
	require.NoError(t, java.Lock(ctx, "orders", 7, 15*time.Second))
	w := result(func() error { return c.Lock("orders").Lock(owner(ctx, "job-1")) })
	awaitSubscribers(t, direct, lockCh, 1)
	proxy.DropAll()
	// go-redis notices on its next read and subscribes again.
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := direct.PubSubNumSub(ctx, lockCh).Result()
		require.NoError(t, err)
		if n[lockCh] == 1 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the waiter never subscribed again")
		time.Sleep(20 * time.Millisecond)
	}
	notYet(t, w, 200*time.Millisecond)
	require.NoError(t, java.Unlock(ctx, "orders", 7))
	r := recv(t, w, 5*time.Second)
	require.NoError(t, r.err)
	assert.Less(t, r.took, 14*time.Second)
}

// Several Go waiters of one Client share one subscription; when its
// connection is cut, go-redis subscribes again and every waiter tries again,
// and the Java release that follows serves them all in turn.
func TestLock_SharedSubscriptionDropped_EveryWaiterStillWoken(t *testing.T) {
	t.Parallel()
	srv := redistest.Real(t)
	proxy, err := faultnet.Start(srv.Addr)
	require.NoError(t, err)
	t.Cleanup(proxy.Close)
	direct := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = direct.Close() })
	viaProxy := redis.NewClient(&redis.Options{Addr: proxy.Addr})
	t.Cleanup(func() { _ = viaProxy.Close() })
	c := redisson.New(viaProxy)
	t.Cleanup(func() { _ = c.Close() })
	java := javapeer.New(direct, false, 0)
	t.Cleanup(java.Close)

	ctx := ctxT(t, 40*time.Second)
	const n = 5
	require.NoError(t, java.Lock(ctx, "orders", 7, 30*time.Second))
	l := c.Lock("orders")
	errc := make(chan error, n)
	for i := range n {
		go func() {
			g := owner(ctx, fmt.Sprintf("job-%d", i))
			if err := l.Lock(g); err != nil {
				errc <- err
				return
			}
			errc <- l.Unlock(g)
		}()
	}
	deadline := time.Now().Add(10 * time.Second)
	for redisson.WaitersOf(c, lockCh) < n {
		require.True(t, time.Now().Before(deadline), "the calls never all waited")
		time.Sleep(10 * time.Millisecond)
	}
	awaitSubscribers(t, direct, lockCh, 1)
	proxy.DropAll()
	deadline = time.Now().Add(10 * time.Second)
	for {
		m, err := direct.PubSubNumSub(ctx, lockCh).Result()
		require.NoError(t, err)
		if m[lockCh] == 1 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the subscription was never made again")
		time.Sleep(20 * time.Millisecond)
	}
	require.NoError(t, java.Unlock(ctx, "orders", 7))
	// Each Go holder's lease is 30 s: the messages woke them all.
	for i := range n {
		select {
		case err := <-errc:
			require.NoError(t, err, "call %d", i)
		case <-time.After(15 * time.Second):
			t.Fatalf("%d of %d calls served", i, n)
		}
	}
}
