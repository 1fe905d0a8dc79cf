package dlock_test

import (
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

func TestSentinel_FailoverWhileBlocked_WaitersStillAcquire(t *testing.T) {
	s := redistest.Sentinel(t)
	newFailover := func() *redis.Client {
		rdb := redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName: s.MasterName, SentinelAddrs: []string{s.SentinelAddr},
		})
		t.Cleanup(func() { _ = rdb.Close() })
		return rdb
	}
	ctx := ctxTimeout(t, time.Minute)
	n := name(t)
	holder := dlock.New(newFailover())
	t.Cleanup(func() { _ = holder.Close() })
	h := holder.Mutex(n)
	require.NoError(t, h.Lock(ctx))

	var served atomic.Int32
	var wg sync.WaitGroup
	for range 2 {
		c := dlock.New(newFailover())
		t.Cleanup(func() { _ = c.Close() })
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				m := c.Mutex(n)
				if assert.NoError(t, m.Lock(ctx)) {
					served.Add(1)
					assert.NoError(t, m.Unlock(ctx))
				}
			}()
		}
	}
	time.Sleep(300 * time.Millisecond)
	s.Failover(t)
	// The lock reached the replica before the failover (the test waited for
	// sync), so the holder still holds it on the new master.
	require.Eventually(t, func() bool { return h.Unlock(ctx) == nil }, 20*time.Second, 100*time.Millisecond,
		"Unlock on the new master")
	within(t, waitGroupDone(&wg), 30*time.Second, "all waiters acquiring after the failover")
	assert.EqualValues(t, 6, served.Load())
}
