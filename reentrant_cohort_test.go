package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faultnet"
)

// The ReentrantMutex runs on the Mutex engine (internal/engine's
// reentrant.go): each Redis grant is a grant of its own, which the last
// Unlock of its owner hands to another owner waiting on the same Client.
// An RWMutex's writers run on it too: TestCountedCohort_* run both kinds.

// Four Clients, four owners on each (one per goroutine), each re-entering
// once per hold: an exact counter, one token per hold (re-entry keeps it)
// strictly increasing across holds, local handoffs between owners, and
// every owner served.
func TestReentrantCohort_OwnersExclude_TokensIncrease_LocalHandoffs(t *testing.T) {
	e := realEnv(t)
	n := name(t)
	const clients, per, rounds = 4, 4, 25
	ctx := ctxTimeout(t, 60*time.Second)
	rec := &cohortRecord{}
	served := make([]int, clients*per)
	var inside, counter int64
	var wg sync.WaitGroup
	for ci := range clients {
		c := e.client(e.rdb())
		for gi := range per {
			who := ci*per + gi
			r := c.ReentrantMutex(n)
			octx := dlock.WithNewOwner(ctx)
			wg.Go(func() {
				for range rounds {
					if err := r.Lock(octx); err != nil {
						t.Error(err)
						return
					}
					token := r.Token(octx)
					if err := r.Lock(octx); err != nil { // re-entry
						t.Error(err)
						return
					}
					if atomic.AddInt64(&inside, 1) != 1 {
						t.Error("two owners held at once")
					}
					v := counter
					time.Sleep(200 * time.Microsecond)
					counter = v + 1
					if got := r.Token(octx); got != token {
						t.Errorf("re-entry changed the token from %d to %d", token, got)
					}
					rec.add(who, token)
					served[who]++
					atomic.AddInt64(&inside, -1)
					for range 2 {
						if err := r.Unlock(octx); err != nil {
							t.Error(err)
						}
					}
				}
			})
		}
	}
	wg.Wait()
	assert.EqualValues(t, clients*per*rounds, counter)
	local := checkTokens(t, rec.tokens, dlock.DefaultCohortHandoffs)
	t.Logf("%d holds, %d handed on locally", len(rec.tokens), local)
	assert.Positive(t, local, "no hold was handed to another owner locally")
	for who, s := range served {
		assert.Equal(t, rounds, s, "owner %d", who)
	}
	requireFreeSoon(t, ctx, e, n)
}

// Owner a's last Unlock hands the lock to owner b waiting on another handle
// of the same Client without a round trip (the next token of the grant's
// block); b then counts its own holds, in Redis too, and a holds nothing.
// A waiter on another Client is served through Redis.
func TestReentrantCohort_LastUnlockHandsToAnotherOwnerOfTheClient(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 20*time.Second)
	c, other := e.client(e.rdb()), e.client(e.rdb())
	for _, tc := range []struct {
		name  string
		on    *dlock.Client
		local bool
	}{{"owner on the same Client", c, true}, {"owner on another Client", other, false}} {
		t.Run(tc.name, func(t *testing.T) {
			// A long time bound: the test waits between the Unlocks.
			a, actx := c.ReentrantMutex(n, dlock.WithCohort(4, time.Minute)), dlock.WithOwner(ctx, "a")
			b, bctx := tc.on.ReentrantMutex(n), dlock.WithOwner(ctx, "b")
			require.NoError(t, a.Lock(actx))
			require.NoError(t, a.Lock(actx))
			first := a.Token(actx)
			done := make(chan error, 1)
			go func() { done <- b.Lock(bctx) }()
			waitQueued(t, e, n, 1)
			if tc.local {
				require.Eventually(t, func() bool { return dlock.LocalWaiters(c) == 1 }, 5*time.Second, time.Millisecond)
			}
			require.NoError(t, a.Unlock(actx))
			select {
			case <-done:
				t.Fatal("b held while a still held once")
			case <-time.After(50 * time.Millisecond):
			}
			require.NoError(t, a.Unlock(actx))
			require.NoError(t, <-done)
			assert.Equal(t, tc.local, b.Token(bctx) == first+1, "tokens %d then %d", first, b.Token(bctx))
			assert.Zero(t, a.Token(actx), "a holds nothing after its last Unlock")
			assert.ErrorIs(t, a.Unlock(actx), dlock.ErrNotHeld)
			count, err := a.HoldCount(actx)
			require.NoError(t, err)
			assert.Zero(t, count)

			require.NoError(t, b.Lock(bctx))
			count, err = b.HoldCount(bctx)
			require.NoError(t, err)
			assert.Equal(t, 2, count)
			assert.Equal(t, "2", e.rdb().HGet(ctx, key(n), "n").Val(), "Redis counts b's holds")
			require.NoError(t, b.Unlock(bctx))
			require.NoError(t, b.Unlock(bctx))
			requireFreeSoon(t, ctx, e, n)
		})
	}
}

// Calls of one owner waiting at once: the first to be granted holds, and
// the others re-enter its grant and leave the queue in Redis, so that the
// owner counts one hold per call, under one token.
func TestReentrantMutex_ConcurrentCallsOfOneOwner_ReenterTheFirstGrant(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 20*time.Second)
	c := e.client(e.rdb())
	holder, hctx := e.client(e.rdb()).ReentrantMutex(n), dlock.WithOwner(ctx, "holder")
	require.NoError(t, holder.Lock(hctx))
	const calls = 3
	octx := dlock.WithOwner(ctx, "o")
	tokens := make(chan uint64, calls)
	for range calls {
		r := c.ReentrantMutex(n)
		go func() {
			if err := r.Lock(octx); err != nil {
				t.Error(err)
				tokens <- 0
				return
			}
			tokens <- r.Token(octx)
		}()
	}
	waitQueued(t, e, n, calls)
	require.NoError(t, holder.Unlock(hctx))
	// The first call granted wakes the others at once; without that they
	// would look again only when the lease they wait out ends (seconds).
	next := func() uint64 {
		select {
		case token := <-tokens:
			return token
		case <-time.After(2 * time.Second):
			t.Fatal("a call of the owner was not let in with the first")
			return 0
		}
	}
	first := next()
	require.NotZero(t, first)
	for range calls - 1 {
		assert.Equal(t, first, next(), "a call of the owner holds under another token")
	}
	r := c.ReentrantMutex(n)
	count, err := r.HoldCount(octx)
	require.NoError(t, err)
	assert.Equal(t, calls, count)
	require.Eventually(t, func() bool { return e.rdb().ZCard(ctx, key(n)+":mq").Val() == 0 }, time.Second, 5*time.Millisecond,
		"the calls that re-entered left places queued")
	for range calls {
		require.NoError(t, r.Unlock(octx))
	}
	assert.ErrorIs(t, r.Unlock(octx), dlock.ErrNotHeld)
	requireFreeSoon(t, ctx, e, n)
}

// A ForceUnlock on another Client reaches an owner whose Client has another
// owner waiting (and so hears the force's notice) at once, not at its next
// renewal, and the waiter is served by a new grant, not by a local handoff
// of the forced one. (An RWMutex's rw_force names the write grant it took,
// as excl_force does.)
func TestCountedCohort_ForceUnlockElsewhere_OwnerToldAtOnce(t *testing.T) {
	for _, k := range countedKinds {
		t.Run(k.name, func(t *testing.T) {
			e := realEnv(t)
			n := name(t)
			ctx := ctxTimeout(t, 20*time.Second)
			c := e.client(e.rdb())
			a, actx := k.with(c, n, dlock.WithCohort(4, time.Minute)), dlock.WithOwner(ctx, "a")
			require.NoError(t, a.Lock(actx))
			first, lost := a.Token(actx), a.Lost(actx)
			b, bctx := k.with(c, n, dlock.WithCohort(4, time.Minute)), dlock.WithOwner(ctx, "b")
			got := make(chan uint64, 1)
			go func() {
				assert.NoError(t, b.Lock(bctx))
				got <- b.Token(bctx)
			}()
			require.Eventually(t, func() bool { return dlock.LocalWaiters(c) == 1 }, 5*time.Second, time.Millisecond)
			// The notice reaches a Client subscribed to the lock's channel.
			require.Eventually(t, func() bool { return k.confirmed(c, b) }, 5*time.Second, time.Millisecond)
			released, err := k.open(e.client(e.rdb()), n).ForceUnlock(ctx)
			require.NoError(t, err)
			require.True(t, released)
			within(t, lost, time.Second, "the owner's loss")
			select {
			case token := <-got:
				assert.Greater(t, token, first+4, "the forced hold was handed on locally, or its reserved tokens reused")
			case <-time.After(5 * time.Second):
				t.Fatal("the waiting owner was not served after the force")
			}
			assert.ErrorIs(t, a.Unlock(actx), dlock.ErrLost)
			require.NoError(t, b.Unlock(bctx))
			requireFreeSoon(t, ctx, e, n)
		})
	}
}

// A partitioned Client whose owner a hands its hold to owner b locally (no
// round trip, so the partition does not stop it): b's hold ends with the
// Redis lease it inherited, and b learns of its loss before an owner on
// another Client holds the lock (an RWMutex's: a writer, or a reader).
func TestFault_CountedCohort_PartitionedLocalHandoff_HolderToldBeforeAnotherClientHolds(t *testing.T) {
	long(t)
	type run struct {
		countedKind
		read bool // the other Client's owner reads
	}
	for _, r := range []run{{countedKinds[0], false}, {countedKinds[1], false}, {countedKinds[1], true}} {
		t.Run(fmt.Sprintf("%s, read %v", r.name, r.read), func(t *testing.T) {
			e := realEnv(t)
			const timeout = time.Second
			ctx := ctxTimeout(t, 20*time.Second)
			n := name(t)
			rdb, proxy := e.proxied()
			c := dlock.New(rdb, dlock.WithWatchdogTimeout(timeout))
			defer c.Close()
			other := e.client(e.rdb(), dlock.WithWatchdogTimeout(timeout))
			a, actx := r.with(c, n, dlock.WithCohort(4, time.Minute)), dlock.WithOwner(ctx, "a")
			b, bctx := r.with(c, n, dlock.WithCohort(4, time.Minute)), dlock.WithOwner(ctx, "b")
			granted := time.Now()
			require.NoError(t, a.Lock(actx))
			first := a.Token(actx)
			locked := make(chan error, 1)
			go func() { locked <- b.Lock(bctx) }()
			waitQueued(t, e, n, 1)
			require.Eventually(t, func() bool { return dlock.LocalWaiters(c) == 1 }, 5*time.Second, time.Millisecond)
			require.Eventually(t, func() bool { return r.confirmed(c, b) }, 5*time.Second, time.Millisecond)
			// Well into the lease, before its first renewal (a third of
			// the timeout): a handoff that gave b a lease of its own would
			// outlive the one in Redis by this much.
			time.Sleep(time.Until(granted.Add(timeout / 4)))

			proxy.Partition()
			start := time.Now()
			require.NoError(t, a.Unlock(actx), "a local handoff sends nothing")
			require.NoError(t, <-locked)
			require.Equal(t, first+1, b.Token(bctx), "not handed on locally")
			hctx, stop := b.HoldContext(bctx)
			defer stop()
			told := endedAt(hctx)

			octx := dlock.WithOwner(ctx, "o")
			o, rw := r.open(other, n), other.RWMutex(n)
			if r.read {
				require.NoError(t, rw.RLock(octx))
			} else {
				require.NoError(t, o.Lock(octx))
			}
			held := time.Now()
			knew := told()
			require.False(t, knew.IsZero(), "b was not told of its loss by the time another Client held")
			t.Logf("partition at 0; b told at %v; the other Client held at %v", knew.Sub(start).Round(time.Millisecond), held.Sub(start).Round(time.Millisecond))
			assert.True(t, knew.Before(held))
			assert.ErrorIs(t, context.Cause(hctx), dlock.ErrLost)

			proxy.Heal()
			assert.ErrorIs(t, b.Unlock(bctx), dlock.ErrLost)
			if r.read {
				require.NoError(t, rw.RUnlock(octx))
			} else {
				assert.Greater(t, o.Token(octx), first+4, "the other Client's grant reused a reserved token")
				require.NoError(t, o.Unlock(octx))
			}
		})
	}
}

// Redis counts one hold more than the owner has (as after a re-entry whose
// reply was lost and could not be read back, or a command go-redis ran
// twice): the owner's count decides, and its last Unlock frees the lock.
// (Once, the Core followed Redis's count: the last Unlock kept a hold the
// owner no longer knew of, renewed until Close.)
func TestReentrantMutex_RedisCountsOneMore_TheOwnersLastUnlockFreesIt(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 20*time.Second)
	c := e.client(e.rdb(), dlock.WithWatchdogTimeout(600*time.Millisecond))
	r, octx := c.ReentrantMutex(n), dlock.WithOwner(ctx, "o")
	require.NoError(t, r.Lock(octx))
	require.NoError(t, e.rdb().HIncrBy(ctx, key(n), "n", 1).Err())
	count, err := r.HoldCount(octx)
	require.NoError(t, err)
	assert.Equal(t, 1, count, "the owner's count")
	require.NoError(t, r.Unlock(octx))
	assert.ErrorIs(t, r.Unlock(octx), dlock.ErrNotHeld)
	requireFreeSoon(t, ctx, e, n)
}

// Redis counts one hold fewer than the owner has: an inner Unlock that
// frees the lock in Redis tells the owner it lost the lock, rather than
// let it believe it still holds.
func TestReentrantMutex_RedisCountsOneFewer_InnerUnlockReportsTheLoss(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 20*time.Second)
	c := e.client(e.rdb())
	r, octx := c.ReentrantMutex(n), dlock.WithOwner(ctx, "o")
	require.NoError(t, r.Lock(octx))
	require.NoError(t, r.Lock(octx))
	lost := r.Lost(octx)
	require.NoError(t, e.rdb().HIncrBy(ctx, key(n), "n", -1).Err())
	assert.ErrorIs(t, r.Unlock(octx), dlock.ErrLost)
	within(t, lost, time.Second, "the owner's loss")
	assert.ErrorIs(t, r.Unlock(octx), dlock.ErrNotHeld)
	requireFreeSoon(t, ctx, e, n)
}

// A re-entry whose reply is lost (it lands, but its reply comes after the
// read timeout), and whose read back is lost too: Redis counts one hold
// more than the owner has. The owner's one Unlock frees the lock, and
// nothing keeps it held afterwards.
func TestReentrantMutex_ReentryReplyLostAndReadBackFailed_UnlocksRelease(t *testing.T) {
	e := realEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 30*time.Second)
	rdb, proxy := e.replyLosing()
	c := e.client(rdb, dlock.WithWatchdogTimeout(3*time.Second))
	r, octx := c.ReentrantMutex(n), dlock.WithOwner(ctx, "o")
	require.NoError(t, r.Lock(octx))
	proxy.SetLatency(0, time.Second) // requests arrive; replies come too late
	require.Error(t, r.Lock(octx), "the re-entry's reply came back within the read timeout")
	proxy.SetLatency(0, 0)
	require.Equal(t, "2", e.rdb().HGet(ctx, key(n), "n").Val(), "the re-entry did not land (the test needs it to)")
	require.NoError(t, r.Unlock(octx), "the owner's one hold")
	assert.ErrorIs(t, r.Unlock(octx), dlock.ErrNotHeld)
	requireFreeSoon(t, ctx, e, n)
}

// The end of a cohort queues an owner's second call in Redis (it waited for
// a local handoff) while its first call is handed the lock: the second
// re-enters the first's grant at once and takes its place out of the
// queue, whichever of the two wake-ups it sees. Before, one of them could
// be lost: the call stayed queued behind its own owner's hold, or its
// place stayed queued, unclaimed, and held the lock up after the owner's
// last Unlock.
func TestReentrantCohort_CohortEndQueuesAnOwnersSecondCall_ItReentersAndLeaves(t *testing.T) {
	e := sharedEnv(t)
	ctx := ctxTimeout(t, 60*time.Second)
	for round := range 30 {
		n := name(t)
		c := e.client(e.rdb())
		h := func() *dlock.ReentrantMutex { return c.ReentrantMutex(n, dlock.WithCohort(1, time.Minute)) }
		w, wctx := h(), dlock.WithOwner(ctx, "w")
		require.NoError(t, w.Lock(wctx))
		x, xctx := h(), dlock.WithOwner(ctx, "x")
		xdone := make(chan error, 1)
		go func() { xdone <- x.Lock(xctx) }()
		waitQueued(t, e, n, 1)
		// (x queues in Redis before it joins the Client's registry, where
		// the local handoff looks: a must come after it there.)
		require.Eventually(t, func() bool { return dlock.LocalWaiters(c) == 1 }, 5*time.Second, time.Millisecond)
		octx := dlock.WithOwner(ctx, "o")
		a, b := h(), h()
		adone, bdone := make(chan error, 1), make(chan error, 1)
		go func() { adone <- a.Lock(octx) }()
		waitQueued(t, e, n, 2)
		require.NoError(t, w.Unlock(wctx)) // to x locally: the cohort is at its bound
		require.NoError(t, <-xdone)
		go func() { bdone <- b.Lock(octx) }()
		require.Eventually(t, func() bool { return dlock.LocalWaiters(c) == 2 }, 5*time.Second, time.Millisecond)
		require.NoError(t, x.Unlock(xctx)) // the cohort ends: b queued, the lock handed to a
		require.NoError(t, <-adone)
		select {
		case err := <-bdone:
			require.NoError(t, err)
		case <-time.After(2 * time.Second):
			t.Fatalf("round %d: the owner's second call waits while its owner holds", round)
		}
		require.Eventually(t, func() bool { return e.rdb().ZCard(ctx, key(n)+":mq").Val() == 0 }, time.Second, time.Millisecond,
			"round %d: a place left queued after both calls of the owner hold", round)
		require.NoError(t, a.Unlock(octx))
		require.NoError(t, a.Unlock(octx))
		requireFreeSoon(t, ctx, e, n)
	}
}

// Close while owners on the Client hand the lock to each other, each
// re-entering once per hold: every call returns, and no goroutine is left
// behind.
func TestCountedCohort_CloseLeaksNothing(t *testing.T) {
	for _, k := range countedKinds {
		t.Run(k.name, func(t *testing.T) {
			e := sharedEnv(t)
			n := name(t)
			ctx := ctxTimeout(t, 20*time.Second)
			ignore := goleak.IgnoreCurrent()
			c := dlock.New(e.rdb())
			r := k.with(c, n, dlock.WithCohort(0, 0))
			var wg sync.WaitGroup
			var holds atomic.Int64
			for range 4 {
				octx := dlock.WithNewOwner(ctx)
				wg.Go(func() {
					for {
						if err := r.Lock(octx); err != nil {
							if !errors.Is(err, dlock.ErrClosed) {
								t.Error(err)
							}
							return
						}
						holds.Add(1)
						if err := r.Lock(octx); err != nil && !errors.Is(err, dlock.ErrClosed) {
							t.Error(err)
						}
						time.Sleep(200 * time.Microsecond)
						for range 2 {
							if err := r.Unlock(octx); err != nil && !errors.Is(err, dlock.ErrClosed) && !errors.Is(err, dlock.ErrLost) {
								t.Error(err)
							}
						}
					}
				})
			}
			time.Sleep(100 * time.Millisecond)
			require.NoError(t, c.Close())
			wg.Wait()
			require.Positive(t, holds.Load())
			goleak.VerifyNone(t, ignore,
				goleak.IgnoreAnyFunction("github.com/alicebob/miniredis/v2/server.(*Server).servePeer"),
				goleak.IgnoreAnyFunction("github.com/alicebob/miniredis/v2/server.(*Server).servePeer.func2"))
			_, err := k.open(e.client(e.rdb()), n).ForceUnlock(ctx)
			require.NoError(t, err)
		})
	}
}

// A re-entry is one round trip, also in a running cohort while other owners
// of the Client wait for its handoff: it has no place in Redis to take out.
func TestReentrantCohort_ReentryWhileOthersWaitLocally_OneRoundTrip(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 20*time.Second)
	cnt := newCounter()
	c := e.client(e.rdb(cnt))
	h := func() *dlock.ReentrantMutex { return c.ReentrantMutex(n, dlock.WithCohort(4, time.Minute)) }
	a, actx := h(), dlock.WithOwner(ctx, "a")
	require.NoError(t, a.Lock(actx))
	b, bctx := h(), dlock.WithOwner(ctx, "b")
	held, reenter, trips := make(chan error, 1), make(chan struct{}), make(chan int, 1)
	go func() {
		held <- b.Lock(bctx)
		<-reenter
		cnt.reset()
		err := b.Lock(bctx)
		n, cmds := cnt.snapshot()
		trips <- n
		if err != nil || n != 1 {
			t.Errorf("re-entry: %v, %d round trips: %v", err, n, cmds)
		}
		for range 2 {
			assert.NoError(t, b.Unlock(bctx))
		}
	}()
	require.Eventually(t, func() bool { return dlock.LocalWaiters(c) == 1 }, 5*time.Second, time.Millisecond)
	other := make(chan error, 1)
	go func() { // waits behind b, and for the cohort's handoff once b holds
		o, octx := h(), dlock.WithOwner(ctx, "c")
		err := o.Lock(octx)
		if err == nil {
			err = o.Unlock(octx)
		}
		other <- err
	}()
	require.Eventually(t, func() bool { return dlock.LocalWaiters(c) == 2 }, 5*time.Second, time.Millisecond)
	require.NoError(t, a.Unlock(actx)) // to b, locally: the cohort runs on, c waiting
	require.NoError(t, <-held)
	time.Sleep(20 * time.Millisecond)
	close(reenter)
	assert.Equal(t, 1, <-trips)
	require.NoError(t, <-other)
}

// An Unlock that leaves the owner holding, whose reply is lost (it lands in
// Redis, or not): the owner's count drops all the same, the hold goes on
// renewed, and the owner's remaining Unlocks release the lock, the last
// one freeing it. Before, the failed Unlock stopped the hold's renewals
// and left the owner's count as it was; a retried Unlock then freed the
// lock in Redis while the owner still held once.
func TestReentrantMutex_InnerUnlockReplyLost_TheCountDropsAndTheHoldGoesOn(t *testing.T) {
	e := realEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 30*time.Second)
	rdb, proxy := e.replyLosing()
	const timeout = 900 * time.Millisecond // renewals every 300 ms
	c := e.client(rdb, dlock.WithWatchdogTimeout(timeout))
	r, octx := c.ReentrantMutex(n), dlock.WithOwner(ctx, "o")
	for range 3 {
		require.NoError(t, r.Lock(octx))
	}
	lost := r.Lost(octx)
	proxy.SetLatency(0, time.Second) // the Unlock lands; its reply comes too late
	require.NoError(t, r.Unlock(octx), "the owner's count dropped; Redis's is only what Status shows")
	proxy.SetLatency(0, 0)
	count, err := r.HoldCount(octx)
	require.NoError(t, err)
	assert.Equal(t, 2, count)
	select {
	case <-lost:
		t.Fatal("the hold was lost: its renewals stopped at the failed Unlock")
	case <-time.After(2 * timeout):
	}
	require.NoError(t, r.Unlock(octx))
	assert.True(t, e.rdb().HExists(ctx, key(n), "o").Val(), "the lock was freed while the owner still held once")
	require.NoError(t, r.Unlock(octx))
	assert.ErrorIs(t, r.Unlock(octx), dlock.ErrNotHeld)
	requireFreeSoon(t, ctx, e, n)
}

// replyLosing returns a go-redis client through a fault proxy whose replies
// a latency of a second or more loses: it gives up after 300 ms, and does
// not retry.
func (e *env) replyLosing() (*redis.Client, *faultnet.Proxy) {
	proxy, err := faultnet.Start(e.srv.Addr)
	require.NoError(e.t, err)
	e.t.Cleanup(proxy.Close)
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr, ReadTimeout: 300 * time.Millisecond, MaxRetries: -1})
	e.t.Cleanup(func() { _ = rdb.Close() })
	return rdb, proxy
}

// countedRound is cohortRound for a counted kind: h (owner hctx) locks, w
// (owner wctx, on h's Client) waits, queued in Redis and in the Client's
// registry, and h unlocks after holding for hold; before, if set, runs
// just before the hold. It returns h's and w's tokens: w's is h's plus one
// only for a local handoff.
func countedRound(t *testing.T, ctx context.Context, e *env, c *dlock.Client, h, w countedLock, hctx, wctx context.Context, n string, hold time.Duration, before func()) (uint64, uint64) {
	t.Helper()
	require.NoError(t, h.Lock(hctx))
	first := h.Token(hctx)
	got := make(chan error, 1)
	go func() { got <- w.Lock(wctx) }()
	waitQueued(t, e, n, 1)
	require.Eventually(t, func() bool { return dlock.LocalWaiters(c) >= 1 }, 5*time.Second, time.Millisecond)
	if before != nil {
		before()
	}
	time.Sleep(hold)
	require.NoError(t, h.Unlock(hctx))
	require.NoError(t, <-got)
	second := w.Token(wctx)
	require.NoError(t, w.Unlock(wctx))
	require.Greater(t, second, first)
	return first, second
}

// Past the cohort's time bound, a counted lock's hold whose Redis grant was
// quiet (nobody queued) passes to another owner of its Client locally while
// nobody else waits, as a Mutex's does
// (TestMutexCohort_PastTheTimeBound_NobodyElseWaits_HandedOnLocally): an
// RWMutex's write try answers a quiet grant as excl_try's hot path does.
func TestCountedCohort_PastTheTimeBound_NobodyElseWaits_HandedOnLocally(t *testing.T) {
	for _, k := range countedKinds {
		t.Run(k.name, func(t *testing.T) {
			e := sharedEnv(t)
			n := name(t)
			ctx := ctxTimeout(t, 20*time.Second)
			c := e.client(e.rdb())
			h, w := k.open(c, n), k.open(c, n) // default bounds: 4 handoffs, 10ms
			hctx, wctx := dlock.WithNewOwner(ctx), dlock.WithNewOwner(ctx)
			octx := dlock.WithNewOwner(ctx) // the name's first grant, from another Client
			o := k.open(e.client(e.rdb()), n)
			require.NoError(t, o.Lock(octx))
			require.NoError(t, o.Unlock(octx))
			countedRound(t, ctx, e, c, h, w, hctx, wctx, n, 0, nil) // subscribes c
			require.Eventually(t, func() bool { return k.confirmed(c, h) }, 5*time.Second, time.Millisecond)
			for round := range 3 {
				first, second := countedRound(t, ctx, e, c, h, w, hctx, wctx, n, 20*time.Millisecond, nil)
				assert.Equal(t, first+1, second, "round %d: not handed on locally past the time bound with nobody else waiting", round)
			}
		})
	}
}

// Past the cohort's time bound, anyone the counted lock's cohort would not
// serve keeps the bound: a writer of another Client, or of the holder's
// own on a handle WithoutCohort, and for an RWMutex a reader of another
// Client or of the holder's own (readers queue behind a writer, and a
// writer cohort never serves them). Each announces itself when it queues,
// and the hold goes back to Redis, which serves the queue in its order: a
// writer queued after w gets its hold after w's.
func TestCountedCohort_PastTheTimeBound_AnotherWaits_KeepsTheBound(t *testing.T) {
	type waiterKind struct {
		name       string
		reader, on bool // a reader; on the holder's Client (a writer there: WithoutCohort)
	}
	for _, k := range countedKinds {
		kinds := []waiterKind{{"writer of another Client", false, false}, {"writer of the same Client WithoutCohort", false, true}}
		if k.name == "RWMutex" {
			kinds = append(kinds, waiterKind{"reader of another Client", true, false}, waiterKind{"reader of the same Client", true, true})
		}
		for _, wk := range kinds {
			t.Run(k.name+", "+wk.name, func(t *testing.T) {
				e := sharedEnv(t)
				n := name(t)
				ctx := ctxTimeout(t, 20*time.Second)
				c, other := e.client(e.rdb()), e.client(e.rdb())
				h, w := k.open(c, n), k.open(c, n)
				hctx, wctx, yctx := dlock.WithNewOwner(ctx), dlock.WithNewOwner(ctx), dlock.WithNewOwner(ctx)
				countedRound(t, ctx, e, c, h, w, hctx, wctx, n, 0, nil) // subscribes c
				require.Eventually(t, func() bool { return k.confirmed(c, h) }, 5*time.Second, time.Millisecond)
				first, second := countedRound(t, ctx, e, c, h, w, hctx, wctx, n, 20*time.Millisecond, nil)
				require.Equal(t, first+1, second, "a quiet round past the bound was not handed on locally")

				on := other
				if wk.on {
					on = c
				}
				yErr, yTok := make(chan error, 1), make(chan uint64, 1)
				// A longer hold, past the bound all the same, leaves the
				// announcement time to reach c on a loaded machine.
				first, second = countedRound(t, ctx, e, c, h, w, hctx, wctx, n, 50*time.Millisecond, func() {
					// y queues after w, and its announcement reaches c during
					// the hold; it takes and gives back its hold at once.
					go func() {
						if wk.reader {
							rw := on.RWMutex(n)
							if err := rw.RLock(yctx); err != nil {
								yErr <- err
								return
							}
							yErr <- rw.RUnlock(yctx)
							return
						}
						y := k.open(on, n)
						if wk.on {
							y = k.with(on, n, dlock.WithoutCohort())
						}
						if err := y.Lock(yctx); err != nil {
							yErr <- err
							return
						}
						yTok <- y.Token(yctx)
						yErr <- y.Unlock(yctx)
					}()
					waitQueued(t, e, n, 2)
				})
				require.NoError(t, <-yErr)
				assert.NotEqual(t, first+1, second, "handed on locally past the bound while another waited")
				if !wk.reader {
					assert.Greater(t, <-yTok, second, "y, queued after w, held before it")
				}
				requireFreeSoon(t, ctx, e, n)
			})
		}
	}
}

// A counted lock's Client whose pub/sub connection broke after a quiet
// grant cannot know who queued meanwhile: past the time bound the hold goes
// back to Redis, as a Mutex's does
// (TestMutexCohort_PastTheTimeBound_PubSubKilled_GoesThroughRedis).
func TestCountedCohort_PastTheTimeBound_PubSubKilled_GoesThroughRedis(t *testing.T) {
	for _, k := range countedKinds {
		t.Run(k.name, func(t *testing.T) {
			e := realEnv(t) // CLIENT KILL reaches every pub/sub connection of its server
			n := name(t)
			ctx := ctxTimeout(t, 20*time.Second)
			c := e.client(e.rdb())
			h, w := k.open(c, n), k.open(c, n)
			hctx, wctx := dlock.WithNewOwner(ctx), dlock.WithNewOwner(ctx)
			countedRound(t, ctx, e, c, h, w, hctx, wctx, n, 0, nil) // subscribes c
			require.Eventually(t, func() bool { return k.confirmed(c, h) }, 5*time.Second, time.Millisecond)
			first, second := countedRound(t, ctx, e, c, h, w, hctx, wctx, n, 20*time.Millisecond, nil)
			require.Equal(t, first+1, second, "a quiet round past the bound was not handed on locally")
			first, second = countedRound(t, ctx, e, c, h, w, hctx, wctx, n, 20*time.Millisecond, func() {
				require.NoError(t, e.rdb().Do(ctx, "client", "kill", "type", "pubsub").Err())
			})
			assert.NotEqual(t, first+1, second, "handed on locally past the bound though the connection broke meanwhile")
		})
	}
}
