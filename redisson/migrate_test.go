package redisson_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock/internal/wire"
	"github.com/dlock-go/dlock/redisson"
	"github.com/dlock-go/dlock/redisson/internal/javapeer"
)

// migrateSlot moves slot, with its keys, from the master at src to the one
// at dst, as redis-cli --cluster reshard does.
func migrateSlot(t *testing.T, all []string, src, dst string, slot uint16) {
	t.Helper()
	ctx := context.Background()
	s := redis.NewClient(&redis.Options{Addr: src})
	d := redis.NewClient(&redis.Options{Addr: dst})
	defer s.Close()
	defer d.Close()
	srcID, err := s.Do(ctx, "cluster", "myid").Text()
	require.NoError(t, err)
	dstID, err := d.Do(ctx, "cluster", "myid").Text()
	require.NoError(t, err)
	require.NoError(t, d.Do(ctx, "cluster", "setslot", slot, "importing", srcID).Err())
	require.NoError(t, s.Do(ctx, "cluster", "setslot", slot, "migrating", dstID).Err())
	keys, err := s.Do(ctx, "cluster", "getkeysinslot", slot, 100).StringSlice()
	require.NoError(t, err)
	host, port, _ := strings.Cut(dst, ":")
	for _, k := range keys {
		require.NoError(t, s.Do(ctx, "migrate", host, port, k, 0, 5000).Err())
	}
	for _, a := range all {
		n := redis.NewClient(&redis.Options{Addr: a})
		require.NoError(t, n.Do(ctx, "cluster", "setslot", slot, "node", dstID).Err())
		n.Close()
	}
}

// slotOwner returns the address of the master serving slot.
func slotOwner(t *testing.T, rdb *redis.ClusterClient, slot uint16) string {
	t.Helper()
	slots, err := rdb.ClusterSlots(context.Background()).Result()
	require.NoError(t, err)
	for _, s := range slots {
		if int(slot) >= s.Start && int(slot) <= s.End {
			return s.Nodes[0].Addr
		}
	}
	t.Fatalf("slot %d unserved", slot)
	return ""
}

// shardedWaiterFollowsMigration: a Go waiter whose sharded subscription the
// server ends, because the slot moved, subscribes again where the slot went
// and is woken by the next release there.
func shardedWaiterFollowsMigration(t *testing.T, rdb *redis.ClusterClient, addrs []string) {
	c := redisson.New(rdb, redisson.WithShardedMode(redisson.ShardedOn))
	t.Cleanup(func() { _ = c.Close() })
	java := javapeer.New(rdb, true, 0)
	t.Cleanup(java.Close)
	ctx := ctxT(t, 30*time.Second)
	name := "migrating"
	ch := "redisson_lock__channel:{" + name + "}"
	slot := wire.Slot(name)
	require.NoError(t, java.Lock(ctx, name, 7, 20*time.Second))
	w := result(func() error { return c.Lock(name).Lock(owner(ctx, "job-1")) })
	awaitClusterSubscribers(t, rdb, ch, true, 1)
	src := slotOwner(t, rdb, slot)
	var dst string
	for _, a := range addrs {
		if a != src {
			dst = a
			break
		}
	}
	migrateSlot(t, addrs, src, dst, slot)
	// The waiter is subscribed again, on the slot's new master.
	deadline := time.Now().Add(10 * time.Second)
	for {
		node := redis.NewClient(&redis.Options{Addr: dst})
		m, err := node.PubSubShardNumSub(ctx, ch).Result()
		_ = node.Close()
		require.NoError(t, err)
		if m[ch] == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no subscriber of %s on %s after the migration", ch, dst)
		}
		time.Sleep(20 * time.Millisecond)
	}
	require.NoError(t, java.Unlock(ctx, name, 7))
	// The holder's lease had 20 s left: the message woke the waiter.
	r := recv(t, w, 5*time.Second)
	require.NoError(t, r.err)
}
