package dlock

import (
	"context"
	"crypto/rand"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock/internal/redistest"
)

// Starvation mode: once a local waiter has waited longer than starveAfter, a
// new Lock on the same Client must queue behind it even though the lock is
// free, and get its turn when that waiter passes it on.
func TestMutex_StarvingLocalWaiter_NewLockQueuesBehindIt(t *testing.T) {
	srv := redistest.Shared(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	c := New(rdb)
	defer c.Close()
	m := c.Mutex("starve-" + rand.Text()[:8])
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// Subscribe the channel and wait for the confirmation, as it would be
	// for a lock with waiters, so that no confirmation wake-up interferes.
	require.Eventually(t, func() bool {
		ok, err := c.hub.Acquire(ctx, m.channel)
		require.NoError(t, err)
		c.hub.Release(m.channel)
		return ok
	}, 2*time.Second, 5*time.Millisecond)

	// A waiter of this Client that has been waiting for a while.
	w, _, err := c.waits.join(m.channel, waitAs{fifo: true})
	require.NoError(t, err)
	c.waits.mu.Lock()
	w.since = time.Now().Add(-2 * starveAfter)
	c.waits.mu.Unlock()

	got := make(chan error, 1)
	go func() { got <- m.Lock(ctx) }()
	select {
	case err := <-got:
		t.Fatalf("Lock barged past a starving waiter (err %v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	exists, err := rdb.Exists(ctx, m.key).Result()
	require.NoError(t, err)
	require.Zero(t, exists, "the free lock was left for the starving waiter")

	// The starving waiter was woken but gives up: it passes its turn on.
	c.waits.mu.Lock()
	w.woken = true
	c.waits.mu.Unlock()
	c.waits.leave(w, false)
	select {
	case err := <-got:
		require.NoError(t, err)
	case <-time.After(2 * time.Second):
		t.Fatal("the queued Lock did not get its turn")
	}
	require.NoError(t, m.Unlock(ctx))
}
