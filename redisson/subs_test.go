package redisson_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/redisson"
)

// pubsubConns counts the server's connections in pub/sub mode.
func pubsubConns(t *testing.T, rdb *redis.Client) int {
	t.Helper()
	s, err := rdb.Do(context.Background(), "CLIENT", "LIST", "TYPE", "pubsub").Text()
	require.NoError(t, err)
	n := 0
	for _, l := range strings.Split(s, "\n") {
		if strings.TrimSpace(l) != "" {
			n++
		}
	}
	return n
}

// eventually polls cond for up to 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Fifty blocked calls of one Client on one lock share one subscription,
// and a call on another lock shares its connection. Every release wakes
// them all, so each is served in turn, one at a time, long before the 30 s
// leases could run out. The last waiter of a channel unsubscribes, and the
// last of all closes the connection.
func TestClient_WaitersShareOneSubscription(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ctx := ctxT(t, 60*time.Second)
	const n = 50
	otherCh := "redisson_lock__channel:{other}"
	require.NoError(t, e.java.Lock(ctx, "orders", 7, 0))
	require.NoError(t, e.java.Lock(ctx, "other", 7, 0))
	require.Zero(t, pubsubConns(t, e.rdb))

	l := e.go_.Lock("orders")
	var inside, overlaps, served atomic.Int64
	errc := make(chan error, n)
	for i := range n {
		go func() {
			g := owner(ctx, fmt.Sprintf("waiter-%d", i))
			if err := l.Lock(g); err != nil {
				errc <- err
				return
			}
			if inside.Add(1) != 1 {
				overlaps.Add(1)
			}
			time.Sleep(time.Millisecond)
			inside.Add(-1)
			served.Add(1)
			errc <- l.Unlock(g)
		}()
	}
	other := result(func() error { return e.go_.Lock("other").Lock(owner(ctx, "other")) })
	eventually(t, "every call waits", func() bool {
		return redisson.WaitersOf(e.go_, lockCh) == n && redisson.WaitersOf(e.go_, otherCh) == 1
	})
	awaitSubscribers(t, e.rdb, lockCh, 1)
	awaitSubscribers(t, e.rdb, otherCh, 1)
	m, err := e.rdb.PubSubNumSub(ctx, lockCh, otherCh).Result()
	require.NoError(t, err)
	assert.Equal(t, map[string]int64{lockCh: 1, otherCh: 1}, m)
	assert.Equal(t, 1, pubsubConns(t, e.rdb), "one pub/sub connection for %d waiters on two channels", n+1)

	start := time.Now()
	require.NoError(t, e.java.Unlock(ctx, "orders", 7))
	for i := range n {
		select {
		case err := <-errc:
			require.NoError(t, err, "call %d", i)
		case <-ctx.Done():
			t.Fatalf("%d of %d calls served", served.Load(), n)
		}
	}
	assert.EqualValues(t, n, served.Load())
	assert.Zero(t, overlaps.Load(), "two holders at once")
	assert.Less(t, time.Since(start), 25*time.Second, "woken by messages, not by leases")

	// The lock's channel lost its last waiter; the other keeps the connection.
	eventually(t, "the lock's channel unsubscribed", func() bool {
		m, err := e.rdb.PubSubNumSub(ctx, lockCh).Result()
		require.NoError(t, err)
		return m[lockCh] == 0
	})
	assert.Equal(t, 1, pubsubConns(t, e.rdb))
	notYet(t, other, 50*time.Millisecond)
	require.NoError(t, e.java.Unlock(ctx, "other", 7))
	require.NoError(t, recv(t, other, 10*time.Second).err)
	require.NoError(t, e.go_.Lock("other").Unlock(owner(ctx, "other")))
	eventually(t, "no pub/sub connection left", func() bool { return pubsubConns(t, e.rdb) == 0 })

	// A new waiter subscribes afresh.
	require.NoError(t, e.java.Lock(ctx, "orders", 7, 0))
	w := result(func() error { return l.Lock(owner(ctx, "late")) })
	awaitSubscribers(t, e.rdb, lockCh, 1)
	require.NoError(t, e.java.Unlock(ctx, "orders", 7))
	require.NoError(t, recv(t, w, 10*time.Second).err)
	require.NoError(t, l.Unlock(owner(ctx, "late")))
}

// Close ends the waiters of shared subscriptions, classic (one connection)
// and sharded (one per channel), and every goroutine the Client started.
func TestClient_Close_EndsSharedSubscriptions(t *testing.T) {
	for _, tc := range []struct {
		name  string
		mode  redisson.ShardedMode
		conns int
	}{
		{"classic", redisson.ShardedOff, 1},
		{"sharded", redisson.ShardedOn, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Real(t)
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
			defer rdb.Close()
			ctx := ctxT(t, 20*time.Second)
			holder := redisson.New(rdb, redisson.WithShardedMode(tc.mode))
			defer holder.Close()
			for _, name := range []string{"a", "b"} {
				require.NoError(t, holder.Lock(name).WithLease(20*time.Second).Lock(owner(ctx, "holder")))
			}
			ignore := goleak.IgnoreCurrent()
			c := redisson.New(rdb, redisson.WithShardedMode(tc.mode))
			const n = 10
			var calls []<-chan timed
			for _, name := range []string{"a", "b"} {
				for i := range n {
					calls = append(calls, result(func() error {
						return c.Lock(name).Lock(owner(ctx, fmt.Sprintf("waiter-%d", i)))
					}))
				}
			}
			eventually(t, "every call waits", func() bool {
				return redisson.WaitersOf(c, "redisson_lock__channel:{a}") == n &&
					redisson.WaitersOf(c, "redisson_lock__channel:{b}") == n
			})
			eventually(t, "subscribed", func() bool { return pubsubConns(t, rdb) == tc.conns })
			require.NoError(t, c.Close())
			for _, r := range calls {
				assert.ErrorIs(t, recv(t, r, 5*time.Second).err, dlock.ErrClosed)
			}
			goleak.VerifyNone(t, ignore)
			eventually(t, "no pub/sub connection left", func() bool { return pubsubConns(t, rdb) == 0 })
		})
	}
}
