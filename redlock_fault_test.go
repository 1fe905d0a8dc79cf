package dlock_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faultnet"
	"github.com/dlock-go/dlock/internal/redistest"
)

// proxiedRedlock makes a Redlock whose connections to srvs go through
// fault-injecting proxies, one per master.
func proxiedRedlock(t *testing.T, srvs []*redistest.Server, opts ...dlock.Option) (*dlock.Redlock, []*faultnet.Proxy) {
	t.Helper()
	var addrs []string
	var proxies []*faultnet.Proxy
	for _, s := range srvs {
		p, err := faultnet.Start(s.Addr)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		proxies = append(proxies, p)
		addrs = append(addrs, p.Addr)
	}
	return redlockOn(t, addrs, opts...), proxies
}

func TestRedlock_MajorityPartitioned_LostWithinValidityBeforeSecondHolder(t *testing.T) {
	srvs := masters(t, 5)
	const lease = 1200 * time.Millisecond
	a, proxies := proxiedRedlock(t, srvs, dlock.WithWatchdogTimeout(lease))
	b := redlockOn(t, addrsOf(srvs), dlock.WithWatchdogTimeout(lease))
	n := name(t)
	ma, mb := a.Mutex(n), b.Mutex(n)
	ctx := ctxTimeout(t, 20*time.Second)

	require.NoError(t, ma.Lock(ctx))
	t1 := ma.Token()
	hctx, cancel := ma.HoldContext(ctx)
	defer cancel()
	lost := ma.Lost()
	time.Sleep(lease / 2) // a renewal or two

	t0 := time.Now()
	for _, p := range proxies[:3] {
		p.Partition()
	}
	got := lockAt(t, ctx, mb)
	var lostAt time.Time
	select {
	case <-lost:
		lostAt = time.Now()
	case at := <-got:
		t.Fatalf("a second holder at %v while the first still believed it held", at.Sub(t0))
	case <-time.After(2 * lease):
		t.Fatal("Lost did not fire")
	}
	within(t, hctx.Done(), time.Second, "hold context cancelled")
	require.ErrorIs(t, context.Cause(hctx), dlock.ErrLost)
	require.LessOrEqual(t, lostAt.Sub(t0), lease, "Lost fired within the validity")
	at := <-got
	require.False(t, at.IsZero())
	require.True(t, lostAt.Before(at), "Lost (%v) before the second holder (%v)", lostAt.Sub(t0), at.Sub(t0))
	require.Greater(t, mb.Token(), t1, "tokens increase across the partition")
	t.Logf("partitioned at 0; Lost at %v (lease %v); second holder at %v", lostAt.Sub(t0).Round(time.Millisecond), lease, at.Sub(t0).Round(time.Millisecond))
	require.NoError(t, mb.Unlock(ctx))
	for _, p := range proxies[:3] {
		p.Heal()
	}
}

// Two of five masters partitioned (a minority) cost the holder nothing: its
// renewals do not wait for them beyond the node timeout, so the hold lasts,
// and locking and unlocking stay quick.
func TestRedlock_MinorityPartitioned_HoldKeptCallsQuick(t *testing.T) {
	long(t)
	srvs := masters(t, 5)
	const lease = 900 * time.Millisecond
	a, proxies := proxiedRedlock(t, srvs, dlock.WithWatchdogTimeout(lease))
	m := a.Mutex(name(t))
	ctx := ctxTimeout(t, 20*time.Second)
	require.NoError(t, m.Lock(ctx))
	proxies[0].Partition()
	proxies[3].Partition()
	defer proxies[0].Heal()
	defer proxies[3].Heal()
	select {
	case <-m.Lost():
		t.Fatal("hold lost with a quorum of masters reachable")
	case <-time.After(3 * lease):
	}
	for range 3 {
		start := time.Now()
		require.NoError(t, m.Unlock(ctx))
		require.NoError(t, m.Lock(ctx))
		require.Less(t, time.Since(start), lease/2, "unlock and lock wait for a partitioned master at most the node timeout")
	}
	require.NoError(t, m.Unlock(ctx))
}

func TestRedlock_MajorityStopped_LostWithinValidityBeforeSecondHolder(t *testing.T) {
	srvs := masters(t, 5)
	const lease = 1200 * time.Millisecond
	ma, mb, _ := rivalsOn(t, srvs, lease)
	ctx := ctxTimeout(t, 20*time.Second)

	require.NoError(t, ma.Lock(ctx))
	t1 := ma.Token()
	lost := ma.Lost()
	time.Sleep(lease / 2)

	t0 := time.Now()
	stopped := srvs[1:4]
	for _, s := range stopped {
		require.NoError(t, s.Process().Signal(syscall.SIGSTOP))
	}
	cont := sync.OnceFunc(func() {
		for _, s := range stopped {
			_ = s.Process().Signal(syscall.SIGCONT)
		}
	})
	t.Cleanup(cont)
	got := lockAt(t, ctx, mb)
	var lostAt time.Time
	select {
	case <-lost:
		lostAt = time.Now()
	case at := <-got:
		t.Fatalf("a second holder at %v while the first still believed it held", at.Sub(t0))
	case <-time.After(2 * lease):
		t.Fatal("Lost did not fire")
	}
	require.LessOrEqual(t, lostAt.Sub(t0), lease, "Lost fired within the validity")
	time.Sleep(100 * time.Millisecond)
	cont()
	at := <-got
	require.False(t, at.IsZero())
	require.True(t, lostAt.Before(at))
	require.Greater(t, mb.Token(), t1)
	t.Logf("stopped at 0; Lost at %v (lease %v); resumed at %v; second holder at %v", lostAt.Sub(t0).Round(time.Millisecond), lease,
		(lostAt.Sub(t0) + 100*time.Millisecond).Round(time.Millisecond), at.Sub(t0).Round(time.Millisecond))
	require.NoError(t, mb.Unlock(ctx))
}

// A master restarted empty while the lock is held gets the key back from
// the holder's watchdog, with the holder's ID and token (and its fencing
// counter raised to it), and the hold goes on.
func TestRedlock_MasterRestartedEmpty_HolderReacquiresIt(t *testing.T) {
	srvs := masters(t, 5)
	const lease = 900 * time.Millisecond
	ma, mb, n := rivalsOn(t, srvs, lease)
	ctx := ctxTimeout(t, 20*time.Second)

	require.NoError(t, ma.Lock(ctx))
	tok := ma.Token()
	var holder string
	require.Eventually(t, func() bool {
		holder = holderOn(t, srvs[1], n)
		return holder != "" && holderOn(t, srvs[0], n) == holder && holderOn(t, srvs[4], n) == holder
	}, time.Second, 5*time.Millisecond)
	srvs[0].Restart(t)
	srvs[4].Restart(t)
	require.Empty(t, holderOn(t, srvs[0], n))
	require.Eventually(t, func() bool {
		return holderOn(t, srvs[0], n) == holder && holderOn(t, srvs[4], n) == holder
	}, 2*lease, 10*time.Millisecond, "the watchdog re-acquired the restarted masters")
	require.Equal(t, tok, fenceOn(t, srvs[0], n))
	// With the key back on the restarted masters, losing two others keeps
	// the quorum.
	srvs[1].Stop()
	srvs[2].Stop()
	time.Sleep(2 * lease)
	select {
	case <-ma.Lost():
		t.Fatal("hold lost with a quorum of masters")
	default:
	}
	ok, err := mb.TryLock(ctx)
	require.NoError(t, err)
	require.False(t, ok)
	require.NoError(t, ma.Unlock(ctx))
	ok, err = mb.TryLock(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	require.Greater(t, mb.Token(), tok)
	require.NoError(t, mb.Unlock(ctx))
}

// Tokens are the maximum over the granting masters and are written back to
// a quorum: a master whose counter ran ahead (as if its clock were an hour
// fast) sets the token and the others of the quorum learn it, so a later
// quorum without that master, or with it restarted empty, still issues
// greater tokens, although the caller's clock (the proposal) is an hour
// behind. A master whose counter is behind never lowers a token. Each step
// uses a fresh Redlock, which knows no earlier token.
func TestRedlock_Tokens_MaxOverQuorumWrittenBack(t *testing.T) {
	srvs := masters(t, 5)
	const lease = 600 * time.Millisecond
	n := name(t)
	ctx := ctxTimeout(t, 20*time.Second)
	ahead := uint64(time.Now().Add(time.Hour).UnixMicro())
	_, err := srvs[0].Do(ctx, "set", key(n)+":rlf", ahead)
	require.NoError(t, err)

	var last uint64
	take := func(what string) {
		t.Helper()
		m := redlockOn(t, addrsOf(srvs), dlock.WithWatchdogTimeout(lease)).Mutex(n)
		require.NoError(t, m.Lock(ctx), what)
		tok := m.Token()
		require.Greater(t, tok, last, what)
		require.Greater(t, tok, ahead, what)
		last = tok
		require.NoError(t, m.Unlock(ctx), what)
	}
	// The quorum is masters 0, 1 and 2: 0 is ahead, 1 and 2 are written back.
	srvs[3].Stop()
	srvs[4].Stop()
	take("0 ahead, 1 and 2 behind")
	for _, s := range srvs[:3] {
		require.Equal(t, last, fenceOn(t, s, n), "written back to every master of the quorum")
	}
	// Without the master ahead: any quorum of 1..4 includes 1 or 2.
	srvs[3].Restart(t)
	srvs[4].Restart(t)
	srvs[0].Stop()
	take("without the master ahead")
	// The master ahead restarted empty at once (within the window): its
	// counter is gone, the others' are not.
	srvs[0].Restart(t)
	take("master restarted empty, within the window")
}

// Exclusion on 5 masters with 3 Redlocks x 8 goroutines, while masters are
// killed and restarted empty (at most 2 down at a time, each out for longer
// than a lease: the delayed restart): no two holders overlap unless the
// first had already been told it lost the lock, the counter is exact but
// for increments lost to such overlaps (one each at most), and tokens
// strictly increase in the order of the holds.
func TestRedlock_Exclusion_MastersKilledAndRestarted(t *testing.T) {
	long(t)
	srvs := masters(t, 5)
	const lease = time.Second
	var rls []*dlock.Redlock
	for range 3 {
		rls = append(rls, redlockOn(t, addrsOf(srvs), dlock.WithWatchdogTimeout(lease)))
	}
	n := name(t)
	run := 7 * time.Second
	if testing.Short() {
		run = 3 * time.Second
	}
	stop := time.Now().Add(run)

	var (
		slot       atomic.Pointer[<-chan struct{}] // the Lost channel of the hold in the critical section
		counter    atomic.Int64
		done       atomic.Int64
		overlaps   atomic.Int64
		excused    atomic.Int64 // a holder entered after the previous one was told it lost
		lastToken  atomic.Uint64
		badTokens  atomic.Int64
		lockErrors atomic.Int64
		kills      atomic.Int64
		firstErr   atomic.Pointer[error]
	)
	var wg sync.WaitGroup
	for _, r := range rls {
		m := r.Mutex(n)
		for range 8 {
			wg.Go(func() {
				for time.Now().Before(stop) {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					err := m.Lock(ctx)
					cancel()
					if err != nil {
						if lockErrors.Add(1) == 1 {
							firstErr.Store(&err)
						}
						continue
					}
					lost := m.Lost()
					if prev := slot.Swap(&lost); prev != nil {
						select {
						case <-*prev:
							excused.Add(1)
						default:
							overlaps.Add(1)
						}
					}
					tok := m.Token()
					if prevTok := lastToken.Swap(tok); tok <= prevTok {
						badTokens.Add(1)
					}
					c := counter.Load()
					time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
					counter.Store(c + 1)
					done.Add(1)
					slot.CompareAndSwap(&lost, nil)
					_ = m.Unlock(context.Background())
				}
			})
		}
	}
	// Chaos, on the test goroutine (Restart may fail the test): kill a
	// master, restart it empty after more than a lease; at most two down at
	// once.
	type downed struct {
		s  *redistest.Server
		at time.Time // when to restart it
	}
	var out []downed
	for time.Now().Add(lease).Before(stop) || len(out) > 0 {
		time.Sleep(time.Duration(200+rand.IntN(300)) * time.Millisecond)
		left := out[:0]
		for _, d := range out {
			if time.Now().After(d.at) {
				d.s.Restart(t)
			} else {
				left = append(left, d)
			}
		}
		out = left
		if len(out) >= 2 || !time.Now().Add(lease).Before(stop) {
			continue
		}
		s := srvs[rand.IntN(len(srvs))]
		if s.Process() == nil {
			continue
		}
		s.Stop()
		kills.Add(1)
		out = append(out, downed{s, time.Now().Add(lease + 200*time.Millisecond)})
	}
	wg.Wait()
	t.Logf("%d critical sections, %d kills, %d lock errors (timeouts), %d entries after a loss", done.Load(), kills.Load(), lockErrors.Load(), excused.Load())
	if e := firstErr.Load(); e != nil {
		t.Logf("first lock error: %v", *e)
	}
	require.Zero(t, overlaps.Load(), "holders overlapped")
	require.Zero(t, badTokens.Load(), "tokens did not increase")
	// An entry after the previous holder was told it lost may overlap that
	// holder's critical section, and so lose at most one increment; with
	// none, the counter is exact.
	require.LessOrEqual(t, counter.Load(), done.Load())
	require.LessOrEqual(t, done.Load()-counter.Load(), excused.Load(), "counter lost more increments than there were entries after a loss")
	require.Greater(t, done.Load(), int64(50))
	require.Greater(t, kills.Load(), int64(3))
}

// A master's fencing counter expires a minute after the lease of the grant
// that raised it, so that no key is kept for good; once the counters and
// the lock's keys are gone everywhere (as after that minute), the next
// token follows the caller's clock and is still greater.
func TestRedlock_Tokens_CounterExpiresAfterLeaseAndAMinute(t *testing.T) {
	srvs := masters(t, 3)
	const lease = 900 * time.Millisecond
	n := name(t)
	ctx := ctxTimeout(t, 20*time.Second)
	m := redlockOn(t, addrsOf(srvs), dlock.WithWatchdogTimeout(lease)).Mutex(n)
	require.NoError(t, m.Lock(ctx))
	tok := m.Token()
	require.NoError(t, m.Unlock(ctx))
	for i, s := range srvs {
		require.Equal(t, tok, fenceOn(t, s, n), "master %d", i)
		v, err := s.Do(ctx, "pttl", key(n)+":rlf")
		require.NoError(t, err)
		ms := v.(int64)
		require.Greater(t, ms, (time.Minute - 5*time.Second).Milliseconds(), "master %d", i)
		require.LessOrEqual(t, ms, (lease + time.Minute).Milliseconds(), "master %d", i)
		_, err = s.Do(ctx, "del", key(n), key(n)+":rlf")
		require.NoError(t, err)
	}
	m = redlockOn(t, addrsOf(srvs)).Mutex(n)
	require.NoError(t, m.Lock(ctx))
	require.Greater(t, m.Token(), tok)
	require.NoError(t, m.Unlock(ctx))
}
