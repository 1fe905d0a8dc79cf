package dlock_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock"
)

// recv reads one value from ch within d.
func recv(t *testing.T, ch <-chan string, d time.Duration, what string) string {
	t.Helper()
	select {
	case v, ok := <-ch:
		require.True(t, ok, "%s: channel closed", what)
		return v
	case <-time.After(d):
		t.Fatalf("%s: nothing within %v", what, d)
		return ""
	}
}

// Candidates on three Clients: one leader at a time, served in arrival
// order on Resign, each term with a greater token; Leader and an observer
// on a fourth Client follow every term.
func TestElection_ThreeCandidates_OneLeaderAtATimeInOrderObserved(t *testing.T) {
	e := sharedEnv(t)
	ctx := ctxTimeout(t, 20*time.Second)
	n := name(t)
	watcher := e.client(e.rdb()).Election(n)
	_, err := watcher.Leader(ctx)
	assert.ErrorIs(t, err, dlock.ErrNoLeader)
	seen := watcher.Observe(ctx)

	cands := make([]*dlock.Election, 3)
	for i := range cands {
		cands[i] = e.client(e.rdb()).Election(n)
	}
	require.NoError(t, cands[0].Campaign(ctx, "c0"))
	assert.Equal(t, "c0", recv(t, seen, 2*time.Second, "first leader observed"))

	var mu sync.Mutex
	var order []string
	elected := make(chan int, 2)
	for i := 1; i <= 2; i++ {
		go func() {
			if assert.NoError(t, cands[i].Campaign(ctx, fmt.Sprintf("c%d", i))) {
				mu.Lock()
				order = append(order, fmt.Sprintf("c%d", i))
				mu.Unlock()
				elected <- i
			}
		}()
		// Queue c1 before c2.
		require.Eventually(t, func() bool {
			st, err := watcher.Status(ctx)
			return err == nil && st.Waiting == i
		}, 5*time.Second, time.Millisecond)
	}
	v, err := watcher.Leader(ctx)
	require.NoError(t, err)
	assert.Equal(t, "c0", v, "campaigners wait while a leader leads")

	tokens := []uint64{cands[0].Token()}
	for _, cur := range []int{0, 1} {
		require.NoError(t, cands[cur].Resign(ctx))
		next := <-elected
		assert.Equal(t, cur+1, next, "served in arrival order")
		assert.Equal(t, fmt.Sprintf("c%d", next), recv(t, seen, 2*time.Second, "next leader observed"))
		v, err := watcher.Leader(ctx)
		require.NoError(t, err)
		assert.Equal(t, fmt.Sprintf("c%d", next), v)
		tokens = append(tokens, cands[next].Token())
		assert.Zero(t, cands[cur].Token(), "a resigned candidate has no term")
	}
	assert.Equal(t, []string{"c1", "c2"}, order)
	assert.Less(t, tokens[0], tokens[1])
	assert.Less(t, tokens[1], tokens[2])

	// A leader that publishes a new value is observed again.
	require.NoError(t, cands[2].Campaign(ctx, "c2-v2"))
	assert.Equal(t, "c2-v2", recv(t, seen, 2*time.Second, "new value observed"))
	require.NoError(t, cands[2].Resign(ctx))
	_, err = watcher.Leader(ctx)
	assert.ErrorIs(t, err, dlock.ErrNoLeader)
	assert.ErrorIs(t, cands[2].Resign(ctx), dlock.ErrNotHeld)
}

// Observe does not poll: with a leader in office, an observer's Client
// sends nothing for a whole second.
func TestElection_Observe_SendsNothingWhileNothingChanges(t *testing.T) {
	e := sharedEnv(t)
	ctx := ctxTimeout(t, 10*time.Second)
	n := name(t)
	leader := e.client(e.rdb()).Election(n)
	require.NoError(t, leader.Campaign(ctx, "v"))
	cnt := newCounter()
	obs := e.client(e.rdb(cnt)).Election(n)
	octx, stop := context.WithCancel(ctx)
	seen := obs.Observe(octx)
	assert.Equal(t, "v", recv(t, seen, 2*time.Second, "leader observed"))
	// The subscription settles, and the observer looks once more after it
	// (a change may have come between its first look and the subscription).
	time.Sleep(1500 * time.Millisecond)
	_, before := cnt.snapshot()
	time.Sleep(time.Second)
	_, after := cnt.snapshot()
	assert.Equal(t, before, after, "the observer sent commands while nothing changed")
	stop()
	select {
	case _, ok := <-seen:
		assert.False(t, ok, "the channel closes when ctx ends")
	case <-time.After(2 * time.Second):
		t.Fatal("Observe's channel not closed after ctx ended")
	}
}

// A leader cut off from Redis learns it lost office before the next
// candidate is elected; the observers see the new leader.
func TestElection_PartitionedLeader_LearnsBeforeTheNextIsElected(t *testing.T) {
	long(t)
	e := realEnv(t)
	ctx := ctxTimeout(t, 20*time.Second)
	n := name(t)
	rdb, proxy := e.proxied()
	const timeout = time.Second
	old := e.client(rdb, dlock.WithWatchdogTimeout(timeout)).Election(n)
	require.NoError(t, old.Campaign(ctx, "old"))
	hctx, stopHold := old.HoldContext(ctx)
	defer stopHold()
	knew := endedAt(hctx)
	seen := e.client(e.rdb()).Election(n).Observe(ctx)
	assert.Equal(t, "old", recv(t, seen, 2*time.Second, "old leader observed"))

	next := e.client(e.rdb(), dlock.WithWatchdogTimeout(timeout)).Election(n)
	electedAt := make(chan time.Time, 1)
	go func() {
		if assert.NoError(t, next.Campaign(ctx, "new")) {
			electedAt <- time.Now()
		}
	}()
	time.Sleep(50 * time.Millisecond)
	proxy.Partition()
	at := <-electedAt
	assert.Equal(t, "new", recv(t, seen, 3*time.Second, "new leader observed"))
	require.False(t, knew().IsZero(), "the old leader was never told")
	assert.True(t, knew().Before(at), "the old leader learned only after the next was elected")
	t.Logf("old leader told %v before the next was elected", at.Sub(knew()).Round(time.Millisecond))
	assert.Greater(t, next.Token(), uint64(0))
}

func TestElection_BadInput(t *testing.T) {
	e := sharedEnv(t)
	ctx := ctxTimeout(t, 5*time.Second)
	c := e.client(e.rdb())
	assert.ErrorIs(t, c.Election("").Campaign(ctx, "v"), dlock.ErrInvalid)
	_, err := c.Election("").Leader(ctx)
	assert.ErrorIs(t, err, dlock.ErrInvalid)
	_, ok := <-c.Election("").Observe(ctx)
	assert.False(t, ok, "Observe on a bad handle closes at once")
	m := c.Mutex(name(t))
	require.NoError(t, m.Lock(ctx))
	err = c.Election(m.Name()).Campaign(ctx, "v")
	assert.ErrorIs(t, err, dlock.ErrInvalid)
	assert.Contains(t, err.Error(), "a mutex")
}
