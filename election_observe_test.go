package dlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
)

// An Observe whose reader stops reading ends when its Client closes, though
// its ctx never ends: its goroutine is gone and its channel closed.
func TestElection_ObserveUnread_ClientCloseEndsItsGoroutine(t *testing.T) {
	e := sharedEnv(t)
	ctx := ctxTimeout(t, 10*time.Second)
	n := name(t)
	require.NoError(t, e.client(e.rdb()).Election(n).Campaign(ctx, "v"))
	rdb := e.rdb()
	ignore := goleak.IgnoreCurrent()

	c := dlock.New(rdb)
	seen := c.Election(n).Observe(context.Background())
	time.Sleep(200 * time.Millisecond) // it found the leader and waits for the reader
	require.NoError(t, c.Close())
	goleak.VerifyNone(t, ignore,
		goleak.IgnoreAnyFunction("github.com/alicebob/miniredis/v2/server.(*Server).servePeer"),
		goleak.IgnoreAnyFunction("github.com/alicebob/miniredis/v2/server.(*Server).servePeer.func2"))
	select {
	case v, ok := <-seen:
		assert.False(t, ok, "the channel is closed, not delivering %q", v)
	default:
		t.Fatal("the channel is not closed")
	}
}

// An Observe started right before another Client's Campaign sees the new
// leader at once, every time: a notice published before its subscription
// was confirmed is not missed, since it looks again once it is.
func TestElection_ObserveStartedJustBeforeCampaign_SeesTheLeaderAtOnce(t *testing.T) {
	e := sharedEnv(t)
	ctx := ctxTimeout(t, 60*time.Second)
	observers := e.client(e.rdb())
	candidates := e.client(e.rdb())
	var worst time.Duration
	for range 20 {
		n := name(t)
		octx, stop := context.WithCancel(ctx)
		seen := observers.Election(n).Observe(octx)
		cand := candidates.Election(n)
		require.NoError(t, cand.Campaign(ctx, "v"))
		elected := time.Now()
		assert.Equal(t, "v", recv(t, seen, 2*time.Second, "the new leader"))
		took := time.Since(elected)
		worst = max(worst, took)
		assert.Less(t, took, 200*time.Millisecond, "the new leader observed late")
		stop()
		require.NoError(t, cand.Resign(ctx))
	}
	t.Logf("worst delay from Campaign's return to the observer: %v", worst.Round(time.Microsecond))
}

// A notice published while the observer's pub/sub connection is down is
// lost; the re-subscription makes the observer look again, so it sees the
// new leader within a second, not when the old leader's lease would have
// ended (30 s here, the watchdog timeout).
func TestElection_ObserverPubSubKilledWhileLeaderChanges_SeesTheNewLeaderAfterReconnect(t *testing.T) {
	e := realEnv(t)
	ctx := ctxTimeout(t, 20*time.Second)
	rdb := e.rdb()
	n := name(t)
	obsRDB, proxy := e.proxied()
	seen := e.client(obsRDB, dlock.WithWatchdogTimeout(30*time.Second)).Election(n).Observe(ctx)
	first := e.client(e.rdb()).Election(n)
	require.NoError(t, first.Campaign(ctx, "a"))
	assert.Equal(t, "a", recv(t, seen, 2*time.Second, "the first leader"))
	time.Sleep(1500 * time.Millisecond) // past any early look: the observer waits for "a"'s lease

	proxy.Partition() // the observer's reconnection waits for the heal
	require.NoError(t, rdb.ClientKillByFilter(ctx, "TYPE", "pubsub").Err())
	require.Eventually(t, func() bool { return pubsubConns(t, rdb) == 0 }, 2*time.Second, time.Millisecond)
	require.NoError(t, first.Resign(ctx))
	require.NoError(t, e.client(e.rdb()).Election(n).Campaign(ctx, "b")) // its notice reaches nobody
	subs, err := rdb.PubSubNumSub(ctx, key(n)+":ch").Result()
	require.NoError(t, err)
	require.Zero(t, subs[key(n)+":ch"], "the notice was published with the observer subscribed")
	time.Sleep(100 * time.Millisecond)
	proxy.Heal()
	healed := time.Now()
	assert.Equal(t, "b", recv(t, seen, 5*time.Second, "the new leader after the reconnect"))
	took := time.Since(healed)
	assert.Less(t, took, time.Second)
	t.Logf("the new leader observed %v after the connection came back", took.Round(time.Millisecond))
}
