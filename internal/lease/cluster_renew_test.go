package lease

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/scripts"
	"github.com/dlock-go/dlock/internal/wire"
)

// White-box tests of renew_cluster.go against a real 3-master cluster: one
// call of renewals.send, with calls built as the Watchdog builds them, and
// what it settles.
func TestClusterRenew_Internal(t *testing.T) {
	addrs := redistest.Cluster(t, 3)
	// The first leaves the nodes' scripts and slots as they were.
	t.Run("ShebangRejected_FallsBackPerSlotForGood", func(t *testing.T) { shebangRejectedFallsBackPerSlotForGood(t, addrs) })
	t.Run("MigratingSlot_RenewedPerSlotInTheSameSend", func(t *testing.T) { migratingSlotRenewedInTheSameSend(t, addrs) })
}

// settled collects what a renewal send settles.
type settled struct {
	mu      sync.Mutex
	results []RenewResult
}

func (s *settled) settle(r RenewResult) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.results = append(s.results, r)
}

// byLease returns each lease's reply (1, 0, or -2 for an error), failing the
// test when a lease is settled twice.
func (s *settled) byLease(t *testing.T) map[*Lease]int64 {
	t.Helper()
	out := map[*Lease]int64{}
	for _, r := range s.results {
		require.Len(t, r.Replies, len(r.Calls))
		for i, b := range r.Calls {
			rep := r.Replies[i]
			if rep.Err == nil {
				require.Len(t, rep.Res, len(b.Leases))
			}
			for j, l := range b.Leases {
				_, dup := out[l]
				require.False(t, dup, "lease %s settled twice", l.Key)
				if rep.Err != nil {
					out[l] = -2
				} else {
					out[l] = rep.Res[j]
				}
			}
		}
	}
	return out
}

// clusterNodes maps each master's address to a plain client, and returns
// the address of the master serving key.
type clusterNodes struct {
	cc    *redis.ClusterClient
	nodes map[string]*redis.Client
}

func newClusterNodes(t *testing.T, addrs []string) *clusterNodes {
	cn := &clusterNodes{cc: redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs}), nodes: map[string]*redis.Client{}}
	t.Cleanup(func() { _ = cn.cc.Close() })
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		t.Cleanup(func() { _ = c.Close() })
		cn.nodes[a] = c
	}
	return cn
}

func (cn *clusterNodes) master(t *testing.T, key string) string {
	t.Helper()
	n, err := cn.cc.MasterForKey(context.Background(), key)
	require.NoError(t, err)
	return n.Options().Addr
}

func (cn *clusterNodes) id(t *testing.T, addr string) string {
	t.Helper()
	id, err := cn.nodes[addr].Do(context.Background(), "cluster", "myid").Text()
	require.NoError(t, err)
	return id
}

// keysInSlot returns n lock keys (as the Client names them) in one hash
// slot, and the slot.
func keysInSlot(prefix string, n int) ([]string, uint16) {
	var out []string
	var s uint16
	for i := 0; len(out) < n; i++ {
		k := "dlock:{" + fmt.Sprintf("%s-%d", prefix, i) + "}"
		switch {
		case len(out) == 0:
			s = wire.Slot(k)
		case wire.Slot(k) != s:
			continue
		}
		out = append(out, k)
	}
	return out, s
}

// askingRead reads a key's holder and PTTL on a node importing its slot.
func askingRead(ctx context.Context, node *redis.Client, k string) (string, time.Duration, error) {
	var get *redis.StringCmd
	var ttl *redis.DurationCmd
	_, err := node.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Do(ctx, "asking")
		get = p.HGet(ctx, k, "o")
		p.Do(ctx, "asking")
		ttl = p.PTTL(ctx, k)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return "", 0, err
	}
	v, _ := get.Result()
	return v, ttl.Val(), nil
}

// One send with leases whose slot is being migrated: the node renews the
// keys it still has, answers -1 for the ones that moved and the one that is
// gone, and the sender renews those in the same send, one call per lease
// (a call for all of them would get TRYAGAIN), settled as of the node
// request's send time.
func migratingSlotRenewedInTheSameSend(t *testing.T, addrs []string) {
	cn := newClusterNodes(t, addrs)
	ctx := context.Background()
	const ttl = 5 * time.Second

	moving, s := keysInSlot(t.Name()+"-moving", 5)
	src := cn.master(t, moving[0])
	var dst string
	for _, a := range addrs {
		if a != src {
			dst = a
			break
		}
	}
	others, _ := keysInSlot(t.Name()+"-other", 1)
	for i := range 30 { // elsewhere, on every node
		k, _ := keysInSlot(fmt.Sprintf("%s-spread%d", t.Name(), i), 1)
		others = append(others, k...)
	}
	all := append(append([]string{}, moving...), others...)
	gone := moving[4] // never written: its hold is gone
	for _, k := range all {
		if k == gone {
			continue
		}
		require.NoError(t, cn.cc.HSet(ctx, k, "o", "id-"+k).Err())
		require.NoError(t, cn.cc.PExpire(ctx, k, time.Second).Err())
	}

	// Slot s half migrated from src to dst: keys 0 and 1 moved.
	require.NoError(t, cn.nodes[dst].Do(ctx, "cluster", "setslot", s, "importing", cn.id(t, src)).Err())
	require.NoError(t, cn.nodes[src].Do(ctx, "cluster", "setslot", s, "migrating", cn.id(t, dst)).Err())
	host, port, _ := strings.Cut(dst, ":")
	require.NoError(t, cn.nodes[src].Do(ctx, "migrate", host, port, "", 0, 5000, "keys", moving[0], moving[1]).Err())

	leases := make([]*Lease, len(all))
	for i, k := range all {
		leases[i] = &Lease{Key: k, Arg: "oid-" + k, TTL: ttl, idx: -1}
	}
	calls := (&Watchdog{cluster: true}).batches(leases)
	r := &Renewals{rdb: cn.cc}
	var got settled
	before := time.Now()
	r.Send(ctx, calls, got.settle)

	replies := got.byLease(t)
	require.Len(t, replies, len(leases), "every lease settled once")
	for _, l := range leases {
		want := int64(1)
		if l.Key == gone {
			want = 0
		}
		assert.Equal(t, want, replies[l], "reply for %s", l.Key)
	}
	assert.False(t, r.perSlot.Load(), "still per node")
	// Each master's request settles once, as of its own send time; then
	// src's per-slot retry: one call for each of the three leases answered
	// -1, settled as of src's request, sent before it.
	var srcSent time.Time
	for _, res := range got.results {
		assert.False(t, res.Sent.Before(before))
		for _, b := range res.Calls {
			if len(b.Leases) > 1 && wire.Slot(b.Keys[0]) == s {
				srcSent = res.Sent // the node's reply for moving[2] and moving[3]
			}
		}
	}
	require.False(t, srcSent.IsZero(), "src renewed the keys it still has in one call")
	retried := map[string]bool{}
	for _, res := range got.results {
		for i, b := range res.Calls {
			if wire.Slot(b.Keys[0]) == s && len(b.Leases) == 1 {
				retried[b.Keys[0]] = true
				assert.Equal(t, srcSent, res.Sent, "the retry of %s settled as of src's request", b.Keys[0])
				assert.Equal(t, 1, res.Scripts[i], "one script call per retried lease")
			}
		}
	}
	assert.Equal(t, map[string]bool{moving[0]: true, moving[1]: true, gone: true}, retried,
		"the -1 leases, and only they, retried one call each")

	// Renewed where they are: the moved keys on dst, the rest on src.
	for i, k := range moving[:4] {
		node := cn.nodes[src]
		if i < 2 {
			node = cn.nodes[dst]
		}
		v, d, err := askingRead(ctx, node, k)
		require.NoError(t, err)
		assert.Equal(t, "id-"+k, v, "holder of %s", k)
		assert.Greater(t, d, ttl-time.Second, "PTTL of %s renewed to the new lease", k)
	}
	for _, k := range others {
		d, err := cn.cc.PTTL(ctx, k).Result()
		require.NoError(t, err)
		assert.Greater(t, d, ttl-time.Second, "PTTL of %s", k)
	}
}

// A server that rejects the script's shebang, with the very error Redis 6
// gives (emulated on Redis 7 by the same script with '#' for '#!', which it
// fails to compile in the same words): renewals go per slot from then on,
// in the same send, and the change is noticed once.
func shebangRejectedFallsBackPerSlotForGood(t *testing.T, addrs []string) {
	cn := newClusterNodes(t, addrs)
	ctx := context.Background()
	const ttl = 5 * time.Second
	var leases []*Lease
	for i := range 40 {
		k, _ := keysInSlot(fmt.Sprintf("%s-%d", t.Name(), i), 1)
		require.NoError(t, cn.cc.HSet(ctx, k[0], "o", "x").Err())
		require.NoError(t, cn.cc.PExpire(ctx, k[0], time.Second).Err())
		leases = append(leases, &Lease{Key: k[0], Arg: "ox", TTL: ttl, idx: -1})
	}
	src := scripts.Source("renew_node.lua")
	require.True(t, strings.HasPrefix(src, "#!lua flags=allow-cross-slot-keys\n"))
	r := &Renewals{rdb: cn.cc, nodeScript: redis.NewScript("#" + strings.TrimPrefix(src, "#!"))}
	var got settled
	r.Send(ctx, (&Watchdog{cluster: true}).batches(leases), got.settle)

	replies := got.byLease(t)
	require.Len(t, replies, len(leases))
	for _, l := range leases {
		assert.Equal(t, int64(1), replies[l], "reply for %s", l.Key)
	}
	assert.True(t, r.perSlot.Load(), "per node turned off")
	notices := 0
	for _, res := range got.results {
		if res.Notice != nil {
			notices++
			assert.Contains(t, res.Notice.Error(), "Error compiling script (new function): user_script:1: unexpected symbol near '#'")
		}
	}
	assert.Equal(t, 1, notices, "one notice, however many nodes rejected the script")
	for _, l := range leases {
		d, err := cn.cc.PTTL(ctx, l.Key).Result()
		require.NoError(t, err)
		assert.Greater(t, d, ttl-time.Second, "PTTL of %s", l.Key)
	}

	// From now on, per slot only, in one pipeline per node: each node's
	// request settled on its own, all at the first try.
	got = settled{}
	r.Send(ctx, (&Watchdog{cluster: true}).batches(leases), got.settle)
	require.Len(t, got.results, len(addrs), "one per-slot pipeline per node")
	calls := 0
	for _, res := range got.results {
		calls += len(res.Calls)
		assert.Nil(t, res.Notice)
		for _, n := range res.Scripts {
			assert.Equal(t, 1, n, "one lease a call: one slot a call")
		}
	}
	assert.Equal(t, len(leases), calls, "one call per slot")
	replies = got.byLease(t)
	for _, l := range leases {
		assert.Equal(t, int64(1), replies[l])
	}
}
