package redisson_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/redisson"
	"github.com/dlock-go/dlock/redisson/internal/javapeer"
)

// clusterSubscribers counts the subscribers of channel on every master,
// sharded or classic.
func clusterSubscribers(t *testing.T, rdb *redis.ClusterClient, channel string, sharded bool) int64 {
	t.Helper()
	var mu sync.Mutex
	var n int64
	err := rdb.ForEachMaster(context.Background(), func(ctx context.Context, c *redis.Client) error {
		var m map[string]int64
		var err error
		if sharded {
			m, err = c.PubSubShardNumSub(ctx, channel).Result()
		} else {
			m, err = c.PubSubNumSub(ctx, channel).Result()
		}
		mu.Lock()
		n += m[channel]
		mu.Unlock()
		return err
	})
	require.NoError(t, err)
	return n
}

func awaitClusterSubscribers(t *testing.T, rdb *redis.ClusterClient, channel string, sharded bool, n int64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for clusterSubscribers(t, rdb, channel, sharded) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%q never had %d subscribers", channel, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestCluster runs on one three-master Redis Cluster.
func TestCluster(t *testing.T) {
	t.Parallel()
	addrs := redistest.Cluster(t, 3)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = rdb.Close() })
	t.Run("ShardedAndClassic_WakeBothWays", func(t *testing.T) { shardedAndClassicWakeBothWays(t, rdb) })
	t.Run("WatchdogRenewsLocksInManySlots", func(t *testing.T) { watchdogRenewsLocksInManySlots(t, rdb) })
	t.Run("MismatchedKinds_ExcludeButDoNotWake", func(t *testing.T) { mismatchedKindsDoNotWake(t, rdb) })
	t.Run("ShardedWaiterFollowsMigration", func(t *testing.T) { shardedWaiterFollowsMigration(t, rdb, addrs) })
	t.Run("ShardedWaitersShareAndFollowMigration", func(t *testing.T) { shardedWaitersShareAndFollowMigration(t, rdb, addrs) })
}

// shardedAndClassicWakeBothWays: Go, with ShardedAuto on Redis 7 and with
// ShardedOff, wakes and is woken by a Java side configured the same way.
func shardedAndClassicWakeBothWays(t *testing.T, rdb *redis.ClusterClient) {
	for _, tc := range []struct {
		name    string
		mode    redisson.ShardedMode
		sharded bool // what the Java side is configured with
	}{
		{"auto/java-sharded", redisson.ShardedAuto, true},
		{"off/java-classic", redisson.ShardedOff, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := redisson.New(rdb, redisson.WithShardedMode(tc.mode))
			t.Cleanup(func() { _ = c.Close() })
			java := javapeer.New(rdb, tc.sharded, 0)
			t.Cleanup(java.Close)
			ctx := ctxT(t, 20*time.Second)
			g := owner(ctx, "job-1")
			for _, name := range []string{"orders-" + tc.name, "job{42}-" + tc.name} {
				ch := "redisson_lock__channel:{" + name + "}"
				if name[:4] == "job{" {
					ch = "redisson_lock__channel:" + name
				}
				l := c.Lock(name).WithLease(15 * time.Second)
				require.NoError(t, l.Lock(g))
				j := result(func() error { return java.Lock(ctx, name, 7, 15*time.Second) })
				awaitClusterSubscribers(t, rdb, ch, tc.sharded, 1)
				require.NoError(t, l.Unlock(g))
				r := recv(t, j, 3*time.Second)
				require.NoError(t, r.err)

				w := result(func() error { return l.Lock(g) })
				awaitClusterSubscribers(t, rdb, ch, tc.sharded, 1)
				notYet(t, w, 100*time.Millisecond)
				require.NoError(t, java.Unlock(ctx, name, 7))
				r = recv(t, w, 3*time.Second)
				require.NoError(t, r.err)
				require.NoError(t, l.Unlock(g))
			}

			// The read-write lock's scripts list the hold keys among their
			// KEYS; in a cluster they must share the name's slot.
			rwName := "cfg-" + tc.name
			rw := c.ReadWriteLock(rwName)
			require.NoError(t, rw.RLock(g))
			require.NoError(t, java.ReadLock(ctx, rwName, 7, 0))
			require.NoError(t, java.ReadUnlock(ctx, rwName, 7))
			n, err := rdb.Exists(ctx, rwName).Result()
			require.NoError(t, err)
			assert.Equal(t, int64(1), n)
			wj := result(func() error { return java.WriteLock(ctx, rwName, 8, 0) })
			awaitClusterSubscribers(t, rdb, "redisson_rwlock:{"+rwName+"}", tc.sharded, 1)
			require.NoError(t, rw.RUnlock(g))
			require.NoError(t, recv(t, wj, 3*time.Second).err)
			require.NoError(t, java.WriteUnlock(ctx, rwName, 8))

			latch := "start-" + tc.name
			ok, err := c.CountDownLatch(latch).TrySetCount(ctx, 1)
			require.NoError(t, err)
			require.True(t, ok)
			ja := result(func() error { return java.Await(ctx, latch) })
			awaitClusterSubscribers(t, rdb, "redisson_countdownlatch__channel__{"+latch+"}", tc.sharded, 1)
			require.NoError(t, c.CountDownLatch(latch).CountDown(ctx))
			require.NoError(t, recv(t, ja, 3*time.Second).err)
		})
	}
}

// watchdogRenewsLocksInManySlots: renewal batches are per slot.
func watchdogRenewsLocksInManySlots(t *testing.T, rdb *redis.ClusterClient) {
	c := redisson.New(rdb, redisson.WithWatchdogTimeout(600*time.Millisecond))
	t.Cleanup(func() { _ = c.Close() })
	ctx := ctxT(t, 10*time.Second)
	g := owner(ctx, "job-1")
	names := []string{"a", "b", "c", "d", "e", "f{1}", "g{1}"}
	for _, n := range names {
		require.NoError(t, c.Lock(n).Lock(g))
	}
	time.Sleep(1500 * time.Millisecond)
	for _, n := range names {
		ttl, err := c.Lock(n).TTL(ctx)
		require.NoError(t, err)
		assert.Greater(t, ttl, 100*time.Millisecond, n)
		require.NoError(t, c.Lock(n).Unlock(g))
	}
}

// mismatchedKindsDoNotWake: a Go side on classic pub/sub and a Java side on
// sharded pub/sub still exclude each other, but a release does not wake the
// other side's waiter, which waits out the lease it saw (docs/redisson.md
// §7.5): the two kinds of channels do not mix.
func mismatchedKindsDoNotWake(t *testing.T, rdb *redis.ClusterClient) {
	c := redisson.New(rdb, redisson.WithShardedMode(redisson.ShardedOff))
	t.Cleanup(func() { _ = c.Close() })
	java := javapeer.New(rdb, true, 0)
	t.Cleanup(java.Close)
	ctx := ctxT(t, 20*time.Second)
	g := owner(ctx, "job-1")
	l := c.Lock("mismatch").WithLease(1500 * time.Millisecond)
	require.NoError(t, l.Lock(g))
	j := result(func() error { return java.Lock(ctx, "mismatch", 7, 0) })
	awaitClusterSubscribers(t, rdb, "redisson_lock__channel:{mismatch}", true, 1)
	require.NoError(t, l.Unlock(g))
	r := recv(t, j, 5*time.Second)
	require.NoError(t, r.err)
	assert.Greater(t, r.took, time.Second, "woken by a PUBLISH it does not hear")
	require.NoError(t, java.Unlock(ctx, "mismatch", 7))
}
