package redisson_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock/internal/wire"
	"github.com/dlock-go/dlock/redisson"
	"github.com/dlock-go/dlock/redisson/internal/javapeer"
)

// migrateSlot moves slot, with its keys, from the master at src to the one
// at dst, as redis-cli --cluster reshard does, but telling the masters of
// the slot's new owner in the order of all. When src comes before dst, a
// request in between is sent back and forth with MOVED, and a
// re-subscription is refused until dst is told: a slower migration.
func migrateSlot(t *testing.T, all []string, src, dst string, slot uint16) {
	t.Helper()
	migrateSlotInOrder(t, src, dst, slot, all)
}

// migrateSlotSpec is migrateSlot telling dst first, then src, as the
// cluster specification asks and redis-cli does.
func migrateSlotSpec(t *testing.T, all []string, src, dst string, slot uint16) {
	t.Helper()
	order := []string{dst, src}
	for _, a := range all {
		if a != src && a != dst {
			order = append(order, a)
		}
	}
	migrateSlotInOrder(t, src, dst, slot, order)
}

// migrateSlotInOrder moves slot from src to dst, telling the masters at
// order who owns it in that order.
func migrateSlotInOrder(t *testing.T, src, dst string, slot uint16, order []string) {
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
	for _, a := range order {
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

// shardedWaitersShareAndFollowMigration: the Go waiters of one Client on one
// lock share one sharded subscription; when the server ends it because the
// slot moved, they all hear of it, one subscription is made again where the
// slot went, and every waiter is then served in turn by the releases there.
func shardedWaitersShareAndFollowMigration(t *testing.T, rdb *redis.ClusterClient, addrs []string) {
	c := redisson.New(rdb, redisson.WithShardedMode(redisson.ShardedOn))
	t.Cleanup(func() { _ = c.Close() })
	java := javapeer.New(rdb, true, 0)
	t.Cleanup(java.Close)
	ctx := ctxT(t, 40*time.Second)
	const n = 5
	name := "migrating-shared"
	ch := "redisson_lock__channel:{" + name + "}"
	slot := wire.Slot(name)
	require.NoError(t, java.Lock(ctx, name, 7, 30*time.Second))
	l := c.Lock(name)
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
	for redisson.WaitersOf(c, ch) < n {
		require.True(t, time.Now().Before(deadline), "the calls never all waited")
		time.Sleep(10 * time.Millisecond)
	}
	awaitClusterSubscribers(t, rdb, ch, true, 1)
	require.EqualValues(t, 1, clusterSubscribers(t, rdb, ch, true), "one subscription for %d waiters", n)
	src := slotOwner(t, rdb, slot)
	var dst string
	for _, a := range addrs {
		if a != src {
			dst = a
			break
		}
	}
	// In the spec's order: in the other, a try between the source and the
	// destination being told meets MOVED both ways, and go-redis returns
	// the error after its redirections, which ends the call.
	migrateSlotSpec(t, addrs, src, dst, slot)
	// One subscription again, on the slot's new master.
	deadline = time.Now().Add(10 * time.Second)
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
	assert.EqualValues(t, 1, clusterSubscribers(t, rdb, ch, true))
	require.NoError(t, java.Unlock(ctx, name, 7))
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
