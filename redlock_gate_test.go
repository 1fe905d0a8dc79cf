package dlock_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faultnet"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/wire"
)

// evalCalls returns how many script calls srv has run since its stats were
// last reset.
func evalCalls(t *testing.T, srv *redistest.Server) int {
	t.Helper()
	v, err := srv.Do(context.Background(), "info", "commandstats")
	require.NoError(t, err)
	n := 0
	for _, line := range strings.Split(v.(string), "\n") {
		if strings.HasPrefix(line, "cmdstat_evalsha:") || strings.HasPrefix(line, "cmdstat_eval:") {
			calls := strings.TrimPrefix(strings.Split(line, ",")[0], strings.Split(line, "=")[0]+"=")
			c, err := strconv.Atoi(calls)
			require.NoError(t, err)
			n += c
		}
	}
	return n
}

// Every Client given the same masters, in any order, picks the same gate for
// a name, and names spread over the masters.
func TestRedlock_Gate_SameForEveryClientAndSpread(t *testing.T) {
	srvs := masters(t, 3)
	addrs := addrsOf(srvs)
	r1 := redlockOn(t, addrs)
	r2 := redlockOn(t, []string{addrs[2], addrs[0], addrs[1]})
	used := map[string]int{}
	for i := range 60 {
		n := "gate-" + strconv.Itoa(i)
		_, g1 := dlock.RedlockGate(r1.Mutex(n))
		_, g2 := dlock.RedlockGate(r2.Mutex(n))
		require.Equal(t, g1, g2, "name %s", n)
		used[g1]++
	}
	assert.Len(t, used, 3, "60 names over 3 masters use all of them: %v", used)
}

// A contending waiter's woken try goes to the gate master alone while the
// lock is held there: the other masters see nothing of it. Without the gate, every woken
// waiter asks every master, and waiters of several Clients split the votes.
func TestRedlock_Gate_WaiterRefusedAtGateAsksNoOtherMaster(t *testing.T) {
	srvs := masters(t, 3)
	ma, mb, n := rivalsOn(t, srvs, 20*time.Second)
	gate, _ := dlock.RedlockGate(mb)
	ctx := ctxTimeout(t, 15*time.Second)
	require.NoError(t, ma.Lock(ctx))
	resetStats := func() {
		for _, s := range srvs {
			_, err := s.Do(ctx, "config", "resetstat")
			require.NoError(t, err)
		}
	}
	resetStats()
	got := make(chan error, 1)
	go func() { got <- mb.Lock(ctx) }()
	// b tried every master, was refused, and waits subscribed on each.
	require.Eventually(t, func() bool {
		for _, s := range srvs {
			v, err := s.Do(ctx, "pubsub", "numsub", dlock.RedlockChannel(mb))
			require.NoError(t, err)
			if evalCalls(t, s) == 0 || v.([]any)[1].(int64) == 0 {
				return false
			}
		}
		return true
	}, 5*time.Second, 5*time.Millisecond)
	time.Sleep(50 * time.Millisecond) // the subscriptions' own wake-up has run
	// b has met no other caller: it is not contending yet. As if a split
	// vote had just shown others:
	require.False(t, dlock.RedlockContended(mb), "a lone waiter goes to every master at once")
	dlock.RedlockContend(mb)
	resetStats()
	// A release message that releases nothing wakes b, as one from a
	// holder that lost a master's key would: b looks again.
	other := srvs[(gate+1)%3]
	_, err := other.Do(ctx, "publish", dlock.RedlockChannel(mb), wire.Release{From: "someone", Wake: wire.Wake{N: 1, Kind: wire.KindReleased, IDs: []string{n + "-gone"}}}.Encode())
	require.NoError(t, err)
	require.Eventually(t, func() bool { return evalCalls(t, srvs[gate]) >= 1 }, 2*time.Second, 5*time.Millisecond, "b's try reached the gate")
	time.Sleep(100 * time.Millisecond) // it would reach the others as soon
	for i, s := range srvs {
		if i != gate {
			assert.Zero(t, evalCalls(t, s), "master %d (gate %d) saw b's try", i, gate)
		}
	}
	assert.Equal(t, 1, evalCalls(t, srvs[gate]), "one try at the gate")
	select {
	case err := <-got:
		t.Fatalf("b's Lock returned while a holds: %v", err)
	default:
	}
	require.NoError(t, ma.Unlock(ctx))
	select {
	case err := <-got:
		require.NoError(t, err)
	case <-time.After(2 * time.Second):
		t.Fatal("b was not served after a's Unlock")
	}
	require.NoError(t, mb.Unlock(ctx))
}

// contendedHandoffs runs rounds in which ma holds, mb waits, is marked as
// contending (so that its next try goes to the gate first), and ma unlocks;
// mb must hold within within of the release.
func contendedHandoffs(t *testing.T, ctx context.Context, ma, mb *dlock.Mutex, rounds int, within time.Duration) {
	t.Helper()
	for round := range rounds {
		require.NoError(t, ma.Lock(ctx))
		got := make(chan time.Time, 1)
		go func() {
			if mb.Lock(ctx) == nil {
				got <- time.Now()
			}
			close(got)
		}()
		time.Sleep(150 * time.Millisecond) // b is refused and waits subscribed
		dlock.RedlockContend(mb)
		released := time.Now()
		require.NoError(t, ma.Unlock(ctx))
		at, ok := <-got
		require.True(t, ok, "round %d: b got the lock", round)
		assert.Less(t, at.Sub(released), within, "round %d: b served soon after the release", round)
		require.NoError(t, mb.Unlock(ctx))
	}
}

// With the gate master down, woken waiters still hold: a gate that failed
// its last request is skipped, and the try asks every master.
func TestRedlock_Gate_GateDown_WaitersStillServed(t *testing.T) {
	srvs := masters(t, 3)
	ma, mb, _ := rivalsOn(t, srvs, 5*time.Second)
	gate, _ := dlock.RedlockGate(mb)
	srvs[gate].Stop()
	// b's tries would go to the gate first; woken by the release, b is
	// served without it.
	contendedHandoffs(t, ctxTimeout(t, 20*time.Second), ma, mb, 3, time.Second)
}

// A release reaches the masters at different times. The waiter it wakes
// (on the first master's message) may ask the gate before the gate has
// released; the gate's own message for that release is then ignored, as the
// release was already seen. The waiter must look again soon, not sleep out
// the old holder's lease. Here the holder's link to the gate master lags by
// 40 ms each way, so every release reaches the gate last.
func TestRedlock_Gate_LaggingGate_WaiterServedSoon(t *testing.T) {
	srvs := masters(t, 3)
	addrs := addrsOf(srvs)
	b := redlockOn(t, addrs) // default lease: a waiter that sleeps it out waits 30 s
	n := name(t)
	mb := b.Mutex(n)
	gate, _ := dlock.RedlockGate(mb)
	p, err := faultnet.Start(addrs[gate])
	require.NoError(t, err)
	t.Cleanup(p.Close)
	p.SetLatency(40*time.Millisecond, 40*time.Millisecond)
	holderAddrs := slices.Clone(addrs)
	holderAddrs[gate] = p.Addr
	a := redlockOn(t, holderAddrs)
	ma := a.Mutex(n)
	contendedHandoffs(t, ctxTimeout(t, 60*time.Second), ma, mb, 5, 2*time.Second)
}

// The same lag without a gate: the holder's release reaches one master at
// once and the other two 60 ms later, and the lone waiter hears that one
// master 20 ms late and the others at once. Its woken try is refused by the
// two lagging masters before the first one's grant comes in, and their own
// messages for that release are ignored as already seen: the waiter must
// look again soon, not sleep out the old holder's 30 s lease. (Seen in CI
// as a lone waiter that waited 30 s under load.)
func TestRedlock_LaggingMajority_LoneWaiterServedSoon(t *testing.T) {
	srvs := masters(t, 3)
	addrs := addrsOf(srvs)
	n := name(t)
	first := 0
	proxy := func(i int, lag time.Duration) string {
		p, err := faultnet.Start(addrs[i])
		require.NoError(t, err)
		t.Cleanup(p.Close)
		p.SetLatency(lag, lag)
		return p.Addr
	}
	holderAddrs, waiterAddrs := slices.Clone(addrs), slices.Clone(addrs)
	for i := range addrs {
		if i != first {
			holderAddrs[i] = proxy(i, 30*time.Millisecond)
		}
	}
	waiterAddrs[first] = proxy(first, 10*time.Millisecond)
	b := redlockOn(t, waiterAddrs)
	ma, mb := redlockOn(t, holderAddrs).Mutex(n), b.Mutex(n)
	ctx := ctxTimeout(t, 20*time.Second)
	for round := range 5 {
		require.NoError(t, ma.Lock(ctx))
		got := make(chan time.Time, 1)
		go func() {
			if err := mb.Lock(ctx); err == nil {
				got <- time.Now()
			}
			close(got)
		}()
		require.Eventually(t, func() bool { return dlock.RedlockWaiters(b) == 1 }, 5*time.Second, time.Millisecond)
		time.Sleep(100 * time.Millisecond) // b's subscriptions are confirmed
		released := time.Now()
		require.NoError(t, ma.Unlock(ctx))
		at, ok := <-got
		require.True(t, ok, "round %d: b got the lock", round)
		assert.Less(t, at.Sub(released), 2*time.Second, "round %d: b served soon after the release", round)
		assert.False(t, dlock.RedlockContended(mb), "round %d: a lone waiter's tries are not gated", round)
		require.NoError(t, mb.Unlock(ctx))
	}
}

// Whether a handle contends follows what its tries meet: a lone waiter,
// refused only by the holder it waits for, never goes to the gate (so it
// holds in one round of requests); a waiter that loses the lock to another
// waiter does.
func TestRedlock_Gate_ContendedOnlyWhenOthersCompete(t *testing.T) {
	srvs := masters(t, 3)
	addrs := addrsOf(srvs)
	a, b, c := redlockOn(t, addrs), redlockOn(t, addrs), redlockOn(t, addrs)
	n := name(t)
	ma, mb, mc := a.Mutex(n), b.Mutex(n), c.Mutex(n)
	ctx := ctxTimeout(t, 30*time.Second)
	waitFor := func(m *dlock.Mutex) <-chan error {
		got := make(chan error, 1)
		go func() { got <- m.Lock(ctx) }()
		return got
	}
	for round := range 5 {
		require.NoError(t, ma.Lock(ctx))
		got := waitFor(mb)
		time.Sleep(30 * time.Millisecond)
		require.NoError(t, ma.Unlock(ctx))
		require.NoError(t, <-got, "round %d", round)
		require.NoError(t, mb.Unlock(ctx))
	}
	assert.False(t, dlock.RedlockContended(ma), "the holder met no other caller")
	assert.False(t, dlock.RedlockContended(mb), "the lone waiter met no other caller")

	// Two waiters: whichever loses is refused by the winner, a holder other
	// than the one it waited for.
	require.NoError(t, ma.Lock(ctx))
	gotB, gotC := waitFor(mb), waitFor(mc)
	time.Sleep(30 * time.Millisecond)
	require.NoError(t, ma.Unlock(ctx))
	var winner, loser *dlock.Mutex
	var loserGot <-chan error
	select {
	case err := <-gotB:
		require.NoError(t, err)
		winner, loser, loserGot = mb, mc, gotC
	case err := <-gotC:
		require.NoError(t, err)
		winner, loser, loserGot = mc, mb, gotB
	}
	require.Eventually(t, func() bool { return dlock.RedlockContended(loser) }, 5*time.Second, 5*time.Millisecond,
		"the losing waiter contends")
	require.NoError(t, winner.Unlock(ctx))
	require.NoError(t, <-loserGot)
	require.NoError(t, loser.Unlock(ctx))
}

// Goroutines of one Redlock that lock the same name in a loop all get
// their turns: one that unlocks and locks again at once waits behind the
// waiter its release woke, instead of winning every time.
func TestRedlock_OneRedlock_NoGoroutineStarves(t *testing.T) {
	srvs := masters(t, 3)
	r := redlockOn(t, addrsOf(srvs))
	n := name(t)
	ctx := ctxTimeout(t, 20*time.Second)
	const goroutines = 4
	var got [goroutines]int
	var wg sync.WaitGroup
	stop := time.Now().Add(2 * time.Second)
	for g := range goroutines {
		wg.Go(func() {
			m := r.Mutex(n)
			for time.Now().Before(stop) {
				if err := m.Lock(ctx); err != nil {
					t.Error(err)
					return
				}
				got[g]++
				time.Sleep(time.Millisecond)
				if err := m.Unlock(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	t.Logf("acquisitions per goroutine: %v", got)
	most := slices.Max(got[:])
	for g, c := range got {
		assert.GreaterOrEqual(t, c, most/5, "goroutine %d starved", g)
	}
}
