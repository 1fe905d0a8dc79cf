package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
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

// multiContend runs goroutines on every Client, each taking a MultiLock on
// one of sets (listed in different orders) rounds times and incrementing,
// under it, a counter per member with a read and a write (lost updates show
// a gap in exclusion). It fails the test on a deadlock (ctx ends) and
// checks every counter exactly.
func multiContend(t *testing.T, ctx context.Context, check redis.Cmdable, clients []*dlock.Client, sets [][]string, rounds int) {
	t.Helper()
	inside := map[string]*atomic.Int32{}
	want := map[string]int{}
	for _, s := range sets {
		for _, n := range s {
			if inside[n] == nil {
				inside[n] = new(atomic.Int32)
			}
		}
	}
	var overlaps atomic.Int32
	var wg sync.WaitGroup
	for _, c := range clients {
		for _, set := range sets {
			ml := c.MultiLock(set)
			members := ml.Names() // without duplicates
			for _, n := range members {
				want[n] += rounds
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range rounds {
					if err := ml.Lock(ctx); err != nil {
						t.Errorf("Lock %v: %v", set, err)
						return
					}
					for _, n := range members {
						if inside[n].Add(1) != 1 {
							overlaps.Add(1)
						}
					}
					for _, n := range members {
						v, err := check.Get(ctx, n+":counter").Int()
						if err != nil && !errors.Is(err, redis.Nil) {
							t.Error(err)
						}
						if err := check.Set(ctx, n+":counter", v+1, time.Minute).Err(); err != nil {
							t.Error(err)
						}
					}
					for _, n := range members {
						inside[n].Add(-1)
					}
					if err := ml.Unlock(ctx); err != nil {
						t.Errorf("Unlock %v: %v", set, err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	require.NoError(t, ctx.Err(), "deadlock: the contenders did not finish in time")
	assert.Zero(t, overlaps.Load(), "two holders of one member at once")
	for n, w := range want {
		got, err := check.Get(ctx, n+":counter").Int()
		require.NoError(t, err)
		assert.Equal(t, w, got, "counter of %s", n)
	}
}

// Overlapping name sets, listed in opposite orders on several Clients,
// neither deadlock nor overlap.
func TestMultiLock_OverlappingSetsInOppositeOrders_ExcludeWithoutDeadlock(t *testing.T) {
	e := sharedEnv(t)
	ctx := ctxTimeout(t, 60*time.Second)
	check := e.rdb()
	clients := []*dlock.Client{e.client(e.rdb()), e.client(e.rdb()), e.client(e.rdb())}
	n := name(t)
	a, b, c, d := n+"-a", n+"-b", n+"-c", n+"-d"
	sets := [][]string{{a, b}, {b, a}, {c, b, a}, {a, c}, {d, c}, {c, d, a, a}}
	multiContend(t, ctx, check, clients, sets, 15)
}

// TryLock with one member held elsewhere takes nothing, and leaves the
// other holder alone.
func TestMultiLock_TryLock_AllOrNone(t *testing.T) {
	e := sharedEnv(t)
	ctx := ctxTimeout(t, 10*time.Second)
	c, other := e.client(e.rdb()), e.client(e.rdb())
	n := name(t)
	names := []string{n + "-c", n + "-a", n + "-b"}
	held := other.Mutex(n + "-b")
	require.NoError(t, held.Lock(ctx))

	ml := c.MultiLock(names)
	assert.Equal(t, []string{n + "-a", n + "-b", n + "-c"}, ml.Names())
	ok, err := ml.TryLock(ctx)
	require.NoError(t, err)
	assert.False(t, ok)
	for _, m := range []string{n + "-a", n + "-c"} {
		locked, err := c.Mutex(m).IsLocked(ctx)
		require.NoError(t, err)
		assert.False(t, locked, "%s left held by a failed TryLock", m)
	}
	st, err := held.Status(ctx)
	require.NoError(t, err)
	require.Len(t, st.Holders, 1)
	assert.Equal(t, other.ID(), st.Holders[0].ID[:len(other.ID())], "the other holder lost its hold")
	assert.ErrorIs(t, ml.Unlock(ctx), dlock.ErrNotHeld)
	assert.Nil(t, ml.Tokens())

	require.NoError(t, held.Unlock(ctx))
	ok, err = ml.TryLock(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	tokens := ml.Tokens()
	assert.Len(t, tokens, 3)
	for _, m := range ml.Names() {
		assert.NotZero(t, tokens[m])
		assert.Equal(t, tokens[m], ml.Token(m))
		locked, err := other.Mutex(m).IsLocked(ctx)
		require.NoError(t, err)
		assert.True(t, locked)
	}
	assert.Zero(t, ml.Token("not-a-member"))
	require.NoError(t, ml.Unlock(ctx))
	for _, m := range ml.Names() {
		locked, err := other.Mutex(m).IsLocked(ctx)
		require.NoError(t, err)
		assert.False(t, locked)
	}
}

// A Lock whose ctx ends while it waits for a later member gives back the
// earlier ones and leaves no queue entry.
func TestMultiLock_CtxEndsMidway_ReleasesWhatItTook(t *testing.T) {
	e := sharedEnv(t)
	ctx := ctxTimeout(t, 10*time.Second)
	c, other := e.client(e.rdb()), e.client(e.rdb())
	n := name(t)
	last := other.Mutex(n + "-c")
	require.NoError(t, last.Lock(ctx))

	ml := c.MultiLock([]string{n + "-c", n + "-b", n + "-a"})
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	failed := make(chan error, 1)
	go func() { failed <- ml.Lock(lctx) }()
	// It takes -a and -b, then queues for -c, holding them meanwhile.
	require.Eventually(t, func() bool {
		st, err := last.Status(ctx)
		return err == nil && st.Waiting == 1
	}, 5*time.Second, 5*time.Millisecond, "Lock did not queue for the last member")
	for _, m := range []string{n + "-a", n + "-b"} {
		locked, err := other.Mutex(m).IsLocked(ctx)
		require.NoError(t, err)
		assert.True(t, locked, "Lock did not hold %s while waiting for the last member", m)
	}
	cancel()
	var err error
	select {
	case err = <-failed:
	case <-time.After(5 * time.Second):
		t.Fatal("Lock did not return after its ctx ended")
	}
	assert.ErrorIs(t, err, dlock.ErrNotObtained)
	assert.ErrorIs(t, err, context.Canceled)
	for _, m := range []string{n + "-a", n + "-b"} {
		locked, err := other.Mutex(m).IsLocked(ctx)
		require.NoError(t, err)
		assert.False(t, locked, "%s left held after the ctx ended", m)
	}
	st, err := last.Status(ctx)
	require.NoError(t, err)
	assert.Zero(t, st.Waiting, "a queue entry was left behind")
	assert.True(t, st.Held())
	assert.Nil(t, ml.Lost())
	hctx, done := ml.HoldContext(ctx)
	defer done()
	assert.ErrorIs(t, context.Cause(hctx), dlock.ErrNotHeld)

	// Blocked, it gets the group once the last member is released.
	got := make(chan struct{})
	go func() {
		defer close(got)
		assert.NoError(t, ml.Lock(ctx))
	}()
	time.Sleep(100 * time.Millisecond)
	require.NoError(t, last.Unlock(ctx))
	within(t, got, 3*time.Second, "the group after the last member's release")
	require.NoError(t, ml.Unlock(ctx))
}

// The loss of one member is the group's: Lost closes and the hold context
// ends with a cause matching ErrLost; Unlock releases the others and
// reports the loss.
func TestMultiLock_MemberLost_GroupLostFires(t *testing.T) {
	e := sharedEnv(t)
	rdb := e.rdb()
	c := e.client(e.rdb(), dlock.WithWatchdogTimeout(time.Second))
	ctx := ctxTimeout(t, 10*time.Second)
	n := name(t)
	ml := c.MultiLock([]string{n + "-a", n + "-b", n + "-c"})
	require.NoError(t, ml.Lock(ctx))
	work, done := ml.HoldContext(ctx)
	defer done()
	lost := ml.Lost()
	require.NotNil(t, lost)

	time.Sleep(1200 * time.Millisecond) // more than a lease: renewals keep the group
	select {
	case <-lost:
		t.Fatal("Lost fired while every member was renewed")
	default:
	}
	require.NoError(t, rdb.Del(ctx, key(n+"-b")).Err())
	within(t, dlock.MultiLockMembers(ml)[1].Lost(), 3*time.Second, "member b's Lost after its key was deleted")
	// The group learns it at the same moment as the member, not a
	// goroutine hop later: its Lost has closed already.
	select {
	case <-lost:
	default:
		t.Fatal("the group's Lost had not closed when the member's did")
	}
	within(t, work.Done(), time.Second, "group hold context")
	assert.ErrorIs(t, context.Cause(work), dlock.ErrLost)
	assert.Contains(t, context.Cause(work).Error(), n+"-b")

	err := ml.Unlock(ctx)
	assert.ErrorIs(t, err, dlock.ErrLost)
	for _, m := range []string{n + "-a", n + "-c"} {
		locked, err := c.Mutex(m).IsLocked(ctx)
		require.NoError(t, err)
		assert.False(t, locked, "%s still held after Unlock of a group with a lost member", m)
	}
}

// An Unlock ends the group's hold context as released, not lost.
func TestMultiLock_Unlock_EndsHoldContextNotLost(t *testing.T) {
	e := sharedEnv(t)
	c := e.client(e.rdb())
	ctx := ctxTimeout(t, 10*time.Second)
	n := name(t)
	ml := c.MultiLock([]string{n + "-x", n + "-y"})
	require.NoError(t, ml.Lock(ctx))
	work, done := ml.HoldContext(ctx)
	defer done()
	lost := ml.Lost()
	require.NoError(t, ml.Unlock(ctx))
	within(t, work.Done(), time.Second, "hold context after Unlock")
	assert.NotErrorIs(t, context.Cause(work), dlock.ErrLost)
	select {
	case <-lost:
		t.Fatal("Unlock closed Lost")
	default:
	}
	assert.ErrorIs(t, ml.Unlock(ctx), dlock.ErrNotHeld)
}

// With WithLease, Lock aligns the members' leases: an earlier member taken
// long before the last one still runs the whole lease after Lock returns.
func TestMultiLock_WithLease_LeasesRunFromLock(t *testing.T) {
	e := sharedEnv(t)
	c, other := e.client(e.rdb()), e.client(e.rdb())
	ctx := ctxTimeout(t, 10*time.Second)
	n := name(t)
	blocker := other.Mutex(n + "-b")
	require.NoError(t, blocker.Lock(ctx))
	ml := c.MultiLock([]string{n + "-a", n + "-b"}, dlock.WithLease(1500*time.Millisecond))
	got := make(chan struct{})
	go func() {
		defer close(got)
		assert.NoError(t, ml.Lock(ctx))
	}()
	time.Sleep(700 * time.Millisecond) // -a is taken and its lease runs
	require.NoError(t, blocker.Unlock(ctx))
	within(t, got, 2*time.Second, "the group")
	ttl, err := c.Mutex(n + "-a").TTL(ctx)
	require.NoError(t, err)
	assert.Greater(t, ttl, 1200*time.Millisecond, "the first member's lease was not extended to run from Lock")
	require.NoError(t, ml.Unlock(ctx))
}

func TestMultiLock_BadInput_ErrInvalid(t *testing.T) {
	e := sharedEnv(t)
	c := e.client(e.rdb())
	ctx := ctxTimeout(t, 5*time.Second)
	for _, names := range [][]string{nil, {}, {"a", ""}} {
		ml := c.MultiLock(names)
		assert.ErrorIs(t, ml.Lock(ctx), dlock.ErrInvalid, "%q", names)
		_, err := ml.TryLock(ctx)
		assert.ErrorIs(t, err, dlock.ErrInvalid)
		assert.ErrorIs(t, ml.Unlock(ctx), dlock.ErrInvalid)
	}
	locked, err := c.Mutex("a").IsLocked(ctx)
	require.NoError(t, err)
	assert.False(t, locked)
	_, err = c.MultiLock([]string{"a"}, dlock.WithLease(-1)).TryLock(ctx)
	assert.ErrorIs(t, err, dlock.ErrInvalid)
	_, err = dlock.New(nil).MultiLock([]string{"a"}).TryLock(ctx)
	assert.ErrorIs(t, err, dlock.ErrInvalid)
}

// On a 3-master cluster, members on different nodes are taken and released
// together, by contenders listing them in opposite orders.
func TestCluster_MultiLock_AcrossNodes(t *testing.T) {
	addrs := redistest.Cluster(t, 3)
	ctx := ctxTimeout(t, 90*time.Second)
	check := clusterClient(t, addrs)
	clients := make([]*dlock.Client, 2)
	for i := range clients {
		clients[i] = dlock.New(clusterClient(t, addrs), dlock.WithWatchdogTimeout(1500*time.Millisecond))
		t.Cleanup(func() { _ = clients[i].Close() })
	}
	// One name on each master.
	base := name(t)
	byNode := map[string]string{}
	for i := 0; len(byNode) < 3 && i < 1000; i++ {
		n := fmt.Sprintf("%s-%d", base, i)
		master, err := check.MasterForKey(ctx, key(n))
		require.NoError(t, err)
		addr := master.Options().Addr
		if byNode[addr] == "" {
			byNode[addr] = n
		}
	}
	require.Len(t, byNode, 3)
	var names []string
	for _, n := range byNode {
		names = append(names, n)
	}
	rev := slices.Clone(names)
	slices.Reverse(rev)
	multiContend(t, ctx, check, clients, [][]string{names, rev, names[:2], {names[2], names[0]}}, 10)

	// All or none across nodes.
	held := clients[1].Mutex(names[2])
	require.NoError(t, held.Lock(ctx))
	ml := clients[0].MultiLock(names)
	ok, err := ml.TryLock(ctx)
	require.NoError(t, err)
	assert.False(t, ok)
	for _, n := range names[:2] {
		locked, err := clients[1].Mutex(n).IsLocked(ctx)
		require.NoError(t, err)
		assert.False(t, locked)
	}
	require.NoError(t, held.Unlock(ctx))
	require.NoError(t, ml.Lock(ctx))
	lost := ml.Lost()
	require.NoError(t, check.Del(ctx, key(names[1])).Err())
	within(t, lost, 5*time.Second, "group Lost on the cluster")
	assert.ErrorIs(t, ml.Unlock(ctx), dlock.ErrLost)
}
