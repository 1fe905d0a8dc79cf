package dlock_test

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faultnet"
)

// Regressions of Redlock calls whose masters answer late: what a late answer
// leaves on the masters, and what it races with.

// IsLocked and TTL with a master that answers after the fan-out stopped
// waiting: its answer must not be written where the caller reads (run
// under -race).
func TestRedlock_State_LateMasterNoRace(t *testing.T) {
	srvs := masters(t, 3)
	// A 2s lease: a 200ms node timeout, which the two prompt masters meet
	// even on a loaded machine under -race.
	r, proxies := proxiedRedlock(t, srvs, dlock.WithWatchdogTimeout(2*time.Second))
	n := name(t)
	m := r.Mutex(n)
	ctx := ctxTimeout(t, 10*time.Second)
	require.NoError(t, m.Lock(ctx))
	// Lock returns on a quorum; under load the third grant can still be on
	// its way, and IsLocked below must find the lock on masters 0 and 1.
	require.Eventually(t, func() bool {
		return holderOn(t, srvs[0], n) != "" && holderOn(t, srvs[1], n) != "" && holderOn(t, srvs[2], n) != ""
	}, 2*time.Second, 5*time.Millisecond, "the lock on every master")
	proxies[2].SetLatency(300*time.Millisecond, 0) // past the 200ms node timeout, and its overrun
	// One call at a time, then a pause for the late answer: no other call
	// on the pools orders it after the caller's read.
	// (Under -race on a loaded machine a prompt master can miss the node
	// timeout too, so IsLocked may take another call to see the quorum.)
	require.Eventually(t, func() bool {
		locked, err := m.IsLocked(ctx)
		return err == nil && locked
	}, 3*time.Second, 50*time.Millisecond, "IsLocked with two masters of three answering")
	time.Sleep(800 * time.Millisecond)
	_, err := m.TTL(ctx)
	require.NoError(t, err)
	time.Sleep(800 * time.Millisecond)
	proxies[2].SetLatency(0, 0)
	require.NoError(t, m.Unlock(ctx))
}

// A master that grants a kept try after its hold ended (here by Close) gives
// the grant back, rather than keeping the key for a lease.
func TestRedlock_LateGrantAfterHoldEnded_GivenBack(t *testing.T) {
	srvs := masters(t, 3)
	r, proxies := proxiedRedlock(t, srvs, dlock.WithWatchdogTimeout(3*time.Second))
	n := name(t)
	m := r.Mutex(n)
	ctx := ctxTimeout(t, 10*time.Second)
	require.NoError(t, m.Lock(ctx)) // connections up
	require.NoError(t, m.Unlock(ctx))
	proxies[2].SetLatency(400*time.Millisecond, 0) // past the 300ms node timeout
	require.NoError(t, m.Lock(ctx))                // on masters 0 and 1
	require.Empty(t, holderOn(t, srvs[2], n), "master 2 has not seen the try yet")
	require.NoError(t, r.Close())
	within(t, m.Lost(), time.Second, "Close ends the hold")
	time.Sleep(500 * time.Millisecond) // master 2 grants
	proxies[2].SetLatency(0, 0)
	require.Eventually(t, func() bool { return holderOn(t, srvs[2], n) == "" }, time.Second, 10*time.Millisecond,
		"master 2 keeps the key of a hold that ended")
}

// An Extend that finds the hold gone on a quorum is given back on the
// masters that applied it, which would otherwise keep the key for the new
// lease.
func TestRedlock_ExtendGone_GivenBackWhereApplied(t *testing.T) {
	srvs := masters(t, 3)
	r := redlockOn(t, addrsOf(srvs), dlock.WithWatchdogTimeout(3*time.Second))
	n := name(t)
	m := r.Mutex(n)
	ctx := ctxTimeout(t, 10*time.Second)
	require.NoError(t, m.Lock(ctx))
	require.Eventually(t, func() bool { return holderOn(t, srvs[0], n) != "" }, time.Second, 5*time.Millisecond)
	for _, s := range srvs[1:] {
		_, err := s.Do(ctx, "del", key(n)) // masters 1 and 2 lost it
		require.NoError(t, err)
	}
	require.ErrorIs(t, m.Extend(ctx, time.Hour), dlock.ErrLost)
	require.Empty(t, holderOn(t, srvs[0], n), "master 0 keeps the key for the new lease")
}

// Close waits for the calls still out on a master that does not answer:
// none is left running once it returned.
func TestRedlock_Close_WaitsForCallsToStalledMaster(t *testing.T) {
	srvs := masters(t, 3)
	var rdbs []redis.UniversalClient
	var proxies []*faultnet.Proxy
	for _, s := range srvs {
		p, err := faultnet.Start(s.Addr)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		proxies = append(proxies, p)
		// No ContextTimeoutEnabled: a stalled call lasts its ReadTimeout.
		rdb := redis.NewClient(&redis.Options{Addr: p.Addr, ReadTimeout: 700 * time.Millisecond, MaxRetries: -1})
		t.Cleanup(func() { _ = rdb.Close() })
		rdbs = append(rdbs, rdb)
	}
	r := dlock.NewRedlock(rdbs, dlock.WithWatchdogTimeout(2*time.Second))
	m := r.Mutex(name(t))
	ctx := ctxTimeout(t, 10*time.Second)
	require.NoError(t, m.Lock(ctx)) // connections up
	require.NoError(t, m.Unlock(ctx))
	proxies[2].Partition()
	defer proxies[2].Heal()
	require.NoError(t, m.Lock(ctx))
	require.NoError(t, m.Unlock(ctx))
	start := time.Now()
	require.NoError(t, r.Close())
	took := time.Since(start)
	buf := make([]byte, 1<<20)
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		require.NotContains(t, g, "github.com/dlock-go/dlock.", "a call outlived Close")
	}
	// Each request lasts at most the ReadTimeout; a late answer may be
	// followed by a give-back, on a connection that must be set up anew.
	require.Less(t, took, 5*time.Second, "Close waits for a few ReadTimeouts at most")
}

// Lock and TryLock return by their context's deadline even when a try waits
// for a master that does not answer and gives back on one: the requests
// left go on in the background.
func TestRedlock_LockBoundedByContext_MasterStalledOneRefusing(t *testing.T) {
	srvs := masters(t, 3)
	r, proxies := proxiedRedlock(t, srvs, dlock.WithWatchdogTimeout(5*time.Second)) // node timeout 500ms
	n := name(t)
	m := r.Mutex(n)
	ctx := ctxTimeout(t, 10*time.Second)
	require.NoError(t, m.Lock(ctx)) // connections up
	require.NoError(t, m.Unlock(ctx))
	// Master 0 has another holder; master 2 does not answer.
	_, err := srvs[0].Do(ctx, "hset", key(n), "k", "mutex", "o", "someone-else", "n", 1, "f", 1)
	require.NoError(t, err)
	_, err = srvs[0].Do(ctx, "pexpire", key(n), 10000)
	require.NoError(t, err)
	proxies[2].Partition()
	defer proxies[2].Heal()

	for _, d := range []time.Duration{300 * time.Millisecond, 700 * time.Millisecond} {
		lctx, cancel := context.WithTimeout(ctx, d)
		start := time.Now()
		err = m.Lock(lctx)
		took := time.Since(start)
		cancel()
		require.ErrorIs(t, err, dlock.ErrNotObtained)
		require.Less(t, took, d+150*time.Millisecond, "Lock(%v) overshot its deadline", d)

		tctx, cancel := context.WithTimeout(ctx, d)
		start = time.Now()
		ok, _ := m.TryLock(tctx) // refused, not obtained, or no quorum answered
		took = time.Since(start)
		cancel()
		require.False(t, ok)
		require.Less(t, took, d+150*time.Millisecond, "TryLock(%v) overshot its deadline", d)
	}
	require.Eventually(t, func() bool { return holderOn(t, srvs[1], n) == "" }, time.Second, 10*time.Millisecond, "the tries were given back")
}
