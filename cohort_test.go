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

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/scripts"
)

// cohortRecord is what goroutines write under the lock, in acquisition
// order: who held it and with which token.
type cohortRecord struct {
	mu     sync.Mutex
	who    []int
	tokens []uint64
}

func (r *cohortRecord) add(who int, token uint64) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.who = append(r.who, who)
	r.tokens = append(r.tokens, token)
	return len(r.who)
}

func (r *cohortRecord) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.who)
}

// checkTokens asserts that tokens strictly increase in acquisition order,
// and that no run of local handoffs (tokens one apart, as a cohort issues
// them) is longer than maxHandoffs. It returns how many local handoffs
// there were.
func checkTokens(t *testing.T, tokens []uint64, maxHandoffs int) int {
	t.Helper()
	local, run := 0, 0
	for i := 1; i < len(tokens); i++ {
		if !assert.Greater(t, tokens[i], tokens[i-1], "token %d not above the one before", i) {
			return local
		}
		if tokens[i] == tokens[i-1]+1 {
			local++
			run++
			assert.LessOrEqual(t, run, maxHandoffs, "a cohort ran past its bound at acquisition %d", i)
		} else {
			run = 0
		}
	}
	return local
}

// lockRounds runs rounds of Lock, a lost-update-prone increment under the
// lock, and Unlock in each worker, the handle each Lock uses coming from
// handles[worker](). It checks that nobody else held meanwhile, and returns
// the record of holders and tokens in acquisition order, the counter, and
// how many holds each worker got.
func lockRounds(t *testing.T, ctx context.Context, handles []func() *dlock.Mutex, rounds int) (rec *cohortRecord, counter int64, served []int) {
	t.Helper()
	rec, served = &cohortRecord{}, make([]int, len(handles))
	var inside int64
	var wg sync.WaitGroup
	for who, handle := range handles {
		wg.Go(func() {
			for range rounds {
				m := handle()
				if err := m.Lock(ctx); err != nil {
					t.Error(err)
					return
				}
				if atomic.AddInt64(&inside, 1) != 1 {
					t.Error("two holders at once")
				}
				v := counter // a lost update shows if exclusion fails
				time.Sleep(200 * time.Microsecond)
				counter = v + 1
				rec.add(who, m.Token())
				served[who]++
				atomic.AddInt64(&inside, -1)
				if err := m.Unlock(ctx); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	return rec, counter, served
}

// Four Clients, four goroutines on one handle WithCohort each: an exact
// counter, tokens strictly increasing across local and Redis handoffs, local
// handoffs within the bound, and every goroutine served. The last token is
// set far ahead of the server's clock first, so that each Redis grant
// follows the stored tokens rather than the clock: only the block a grant
// reserves keeps the next grant above the local handoffs' tokens.
func TestMutexCohort_ExclusionTokensAndBound(t *testing.T) {
	// A server of its own: once, in a full CI run on the shared server, a
	// grant here followed the clock instead of the seeded token (the lock's
	// key was gone, most likely flushed by another test), which about 25
	// runs alone, loaded or not, never showed.
	e := realEnv(t)
	n := name(t)
	require.NoError(t, e.rdb().HSet(context.Background(), key(n), "k", "mutex", "f", "8000000000000000").Err())
	const clients, per, rounds, maxHandoffs = 4, 4, 40, 3
	ctx := ctxTimeout(t, 60*time.Second)
	var handles []func() *dlock.Mutex
	for range clients {
		m := e.client(e.rdb()).Mutex(n, dlock.WithCohort(maxHandoffs, time.Second))
		for range per {
			handles = append(handles, func() *dlock.Mutex { return m })
		}
	}
	rec, counter, served := lockRounds(t, ctx, handles, rounds)
	assert.EqualValues(t, clients*per*rounds, counter)
	for i := 1; i < len(rec.tokens); i++ {
		require.Greater(t, rec.tokens[i], rec.tokens[i-1], "token %d not above the one before", i)
	}
	for who, s := range served {
		assert.Equal(t, rounds, s, "goroutine %d", who)
	}
	// Every grant from Redis follows the reserved block (max(f, r) + 1,
	// with the clock behind): a Client's run of consecutive holds is a
	// block, its first token r + 1 for the block before it.
	runs, run, longest := 0, 0, 0
	for i := 1; i < len(rec.tokens); i++ {
		if rec.who[i]/per == rec.who[i-1]/per {
			run++
			longest = max(longest, run)
		} else {
			runs, run = runs+1, 0
		}
	}
	t.Logf("%d acquisitions, %d changes of Client, longest run on one Client %d", len(rec.tokens), runs, longest+1)
	assert.Less(t, runs, len(rec.tokens)/2, "cohorting kept the lock on one Client for several holds")
}

// A waiter on another Client is served within the bound, however many
// goroutines keep the lock busy on the cohort's Client.
func TestMutexCohort_OtherClientServedWithinBound(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	const per, maxHandoffs = 4, 2
	ctx := ctxTimeout(t, 60*time.Second)
	a := e.client(e.rdb()).Mutex(n, dlock.WithCohort(maxHandoffs, time.Minute))
	b := e.client(e.rdb()).Mutex(n)
	var rec cohortRecord
	var stop atomic.Bool
	var wg sync.WaitGroup
	for g := range per {
		wg.Go(func() {
			for !stop.Load() {
				if err := a.Lock(ctx); err != nil {
					t.Error(err)
					return
				}
				rec.add(g, a.Token())
				time.Sleep(300 * time.Microsecond)
				if err := a.Unlock(ctx); err != nil {
					t.Error(err)
				}
			}
		})
	}
	for rec.len() < 20 {
		time.Sleep(time.Millisecond)
	}
	worst := 0
	for range 20 {
		before := rec.len()
		require.NoError(t, b.Lock(ctx))
		between := rec.add(-1, b.Token()) - 1 - before
		worst = max(worst, between)
		time.Sleep(300 * time.Microsecond)
		require.NoError(t, b.Unlock(ctx))
		time.Sleep(time.Duration(1+worst%3) * time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	// The bound: every place ahead of b in the queue in Redis is served
	// before b, and a grant to one of a's goroutines starts a cohort of at
	// most maxHandoffs+1 holds. Ahead of b are the cohort running when b
	// queued and at most one place per other goroutine of a (a goroutine
	// served locally loses its place in Redis, and one that calls Lock while
	// the handle holds waits locally and is queued behind b when the cohort
	// ends). Add the holder that had not recorded itself yet when b called
	// Lock, and one grant during b's first round trip. (An earlier bound of
	// two cohorts counted only one place ahead of b; 40 runs gave a worst
	// of 4-10 on a quiet machine and up to 12 under load.)
	t.Logf("worst: %d acquisitions by the other Client between b's Lock call and its grant", worst)
	assert.LessOrEqual(t, worst, per*(maxHandoffs+1)+2, "b waited past the bound")
	local := checkTokens(t, rec.tokens, maxHandoffs)
	assert.Greater(t, local, len(rec.tokens)/3, "cohorting handed the lock on locally")
}

// A local holder has its own Lost channel and hold context, whether it
// waited on the same handle or on another of its Client: deleting the key
// under a cohort reports the current local holder lost, and not the one
// before it, which had released.
func TestMutexCohort_LostAndHoldContextPerHold(t *testing.T) {
	for _, other := range []bool{false, true} {
		t.Run(map[bool]string{false: "same handle", true: "another handle"}[other], func(t *testing.T) {
			e := sharedEnv(t)
			n := name(t)
			ctx := ctxTimeout(t, 10*time.Second)
			c := e.client(e.rdb(), dlock.WithWatchdogTimeout(600*time.Millisecond))
			m := c.Mutex(n, dlock.WithCohort(0, time.Minute))
			w := m // the waiter's handle
			if other {
				w = c.Mutex(n, dlock.WithCohort(0, time.Minute))
			}
			require.NoError(t, m.Lock(ctx))
			first := m.Token()
			lost1 := m.Lost()
			hctx1, cancel1 := m.HoldContext(context.Background())
			defer cancel1()

			got := make(chan error, 1)
			go func() { got <- w.Lock(ctx) }()
			waitQueued(t, e, n, 1)
			// The waiter joins its Client's registry after its first try's
			// reply: until then a release goes through Redis.
			require.Eventually(t, func() bool { return dlock.LocalWaiters(c) == 1 }, 5*time.Second, time.Millisecond)
			require.NoError(t, m.Unlock(ctx))
			require.NoError(t, <-got)
			assert.Equal(t, first+1, w.Token(), "a local handoff takes the next token")
			within(t, hctx1.Done(), time.Second, "the first hold's context, ended by its Unlock")
			assert.NotErrorIs(t, context.Cause(hctx1), dlock.ErrLost)
			if other {
				assert.Zero(t, m.Token(), "the first handle holds nothing")
				assert.ErrorIs(t, m.Unlock(ctx), dlock.ErrNotHeld)
			}
			lost2 := w.Lost()
			hctx2, cancel2 := w.HoldContext(context.Background())
			defer cancel2()
			select {
			case <-lost2:
				t.Fatal("the new local hold is lost at once")
			default:
			}

			require.NoError(t, e.rdb().Del(ctx, key(n)).Err())
			within(t, lost2, 2*time.Second, "Lost of the local holder after its key was deleted")
			within(t, hctx2.Done(), time.Second, "the local holder's hold context")
			assert.ErrorIs(t, context.Cause(hctx2), dlock.ErrLost)
			select {
			case <-lost1:
				t.Fatal("the released hold was reported lost")
			default:
			}
			assert.ErrorIs(t, w.Unlock(ctx), dlock.ErrLost)
		})
	}
}

// lockedToken runs m.Lock and then m.Unlock in the background; the channel
// gets the token it held (0 when Lock failed).
func lockedToken(t *testing.T, ctx context.Context, m *dlock.Mutex) <-chan uint64 {
	got := make(chan uint64, 1)
	go func() {
		if err := m.Lock(ctx); err != nil {
			t.Error(err)
			got <- 0
			return
		}
		tok := m.Token()
		assert.NoError(t, m.Unlock(ctx))
		got <- tok
	}()
	return got
}

// waitQueued waits until n's queue in Redis has want live waiters.
func waitQueued(t *testing.T, e *env, n string, want int64) {
	t.Helper()
	rdb := e.rdb()
	for range 500 {
		c, err := rdb.ZCard(context.Background(), key(n)+":mq").Result()
		require.NoError(t, err)
		if c >= want {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("%d waiters never queued", want)
}

// A local handoff inherits the lease deadline of the Redis grant: with
// renewals stalled (writes paused) from just after the grant, the local
// holder, on the same handle or another of the Client, is reported lost when
// the grant's lease ends, not a lease after the handoff.
func TestMutexCohort_LocalHoldEndsWithTheRedisLease(t *testing.T) {
	long(t)
	for _, other := range []bool{false, true} {
		t.Run(map[bool]string{false: "same handle", true: "another handle"}[other], func(t *testing.T) {
			e := realEnv(t)
			n := name(t)
			ctx := ctxTimeout(t, 20*time.Second)
			const timeout = 3 * time.Second // renewals every second
			c := e.client(e.rdb(), dlock.WithWatchdogTimeout(timeout))
			m := c.Mutex(n, dlock.WithCohort(0, time.Minute))
			w := m
			if other {
				w = c.Mutex(n, dlock.WithCohort(0, time.Minute))
			}
			granted := time.Now()
			require.NoError(t, m.Lock(ctx))
			got := make(chan error, 1)
			go func() { got <- w.Lock(ctx) }()
			if other {
				waitQueued(t, e, n, 1) // it tried and queued: no cohort of c had waiters at m's grant
			} else {
				// It waits for the local handoff, with no place in Redis.
				require.Eventually(t, func() bool { return dlock.LocalWaiters(c) == 1 }, time.Second, time.Millisecond)
			}
			first := m.Token()
			time.Sleep(100 * time.Millisecond) // the waiter's tries are in
			// From now on renewals hang: the first one is due a second
			// after the grant.
			require.NoError(t, e.rdb().Do(ctx, "CLIENT", "PAUSE", (2*timeout).Milliseconds(), "WRITE").Err())
			defer e.rdb().Do(context.Background(), "CLIENT", "UNPAUSE")
			time.Sleep(700 * time.Millisecond)
			// The handoff is local; Unlock then takes the other handle's
			// waiter's place out of the queue, a write that waits for the
			// pause to end.
			go func() { _ = m.Unlock(ctx) }()
			for w.Token() != first+1 {
				require.Less(t, time.Since(granted), timeout, "no local handoff")
				time.Sleep(time.Millisecond)
			}
			handed := time.Since(granted)
			within(t, w.Lost(), 2*timeout, "Lost of the local holder")
			t.Logf("handed over %v after the grant, lost %v after it", handed, time.Since(granted))
			assert.Less(t, time.Since(granted), timeout+200*time.Millisecond, "the local hold outlived the lease it inherited")
			<-got
		})
	}
}

// A local waiter whose ctx ends as the lock is handed to it leaves nothing
// held: the lock goes on, to Redis or to the next waiter.
func TestMutexCohort_CancelledLocalWaiterLeavesNothingHeld(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 30*time.Second)
	m := e.client(e.rdb()).Mutex(n, dlock.WithCohort(0, time.Minute))
	other := e.client(e.rdb()).Mutex(n)
	failed := 0
	for i := range 40 {
		require.NoError(t, m.Lock(ctx))
		wctx, cancel := context.WithCancel(ctx)
		got := make(chan error, 1)
		go func() { got <- m.Lock(wctx) }()
		time.Sleep(10 * time.Millisecond) // waiting, in Redis or locally
		// Cancel and unlock together: the handoff and the end of ctx race.
		go cancel()
		if i%2 == 0 {
			time.Sleep(time.Duration(i%5) * 10 * time.Microsecond)
		}
		require.NoError(t, m.Unlock(ctx))
		err := <-got
		if err != nil {
			failed++
			require.ErrorIs(t, err, dlock.ErrNotObtained)
			assert.Zero(t, m.Token(), "round %d: a cancelled Lock left a hold", i)
		} else {
			require.NoError(t, m.Unlock(ctx))
		}
		// Nothing is held: another Client takes the lock at once.
		tctx, tcancel := context.WithTimeout(ctx, 2*time.Second)
		require.NoError(t, other.Lock(tctx), "round %d", i)
		tcancel()
		require.NoError(t, other.Unlock(ctx))
		cancel()
	}
	t.Logf("%d of 40 waiters gave up", failed)
}

// Close with a cohort running ends every Lock with ErrClosed, leaves no
// goroutine behind, and leaves the lock free for others.
func TestMutexCohort_CloseLeaksNothing(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	rdb := e.rdb()
	ctx := ctxTimeout(t, 20*time.Second)
	other := e.client(e.rdb()).Mutex(n)
	ignore := goleak.IgnoreCurrent()
	c := dlock.New(rdb)
	m := c.Mutex(n, dlock.WithCohort(0, 0))
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				if err := m.Lock(ctx); err != nil {
					if !errors.Is(err, dlock.ErrClosed) {
						t.Error(err)
					}
					return
				}
				time.Sleep(200 * time.Microsecond)
				if err := m.Unlock(ctx); err != nil && !errors.Is(err, dlock.ErrClosed) && !errors.Is(err, dlock.ErrLost) {
					t.Error(err)
				}
			}
		})
	}
	time.Sleep(100 * time.Millisecond)
	require.NoError(t, c.Close())
	wg.Wait()
	goleak.VerifyNone(t, ignore,
		goleak.IgnoreAnyFunction("github.com/alicebob/miniredis/v2/server.(*Server).servePeer"),
		goleak.IgnoreAnyFunction("github.com/alicebob/miniredis/v2/server.(*Server).servePeer.func2"))
	// A hold Close ended still stands in Redis until its lease runs out;
	// with the default watchdog that is 30s, so release it as an operator.
	_, err := other.ForceUnlock(ctx)
	require.NoError(t, err)
	require.NoError(t, other.Lock(ctx))
	require.NoError(t, other.Unlock(ctx))
}

// A hold that Extend set apart is not handed on locally: it goes back to
// Redis, where the waiter still has its place.
func TestMutexCohort_ExtendedHoldGoesThroughRedis(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 10*time.Second)
	m := e.client(e.rdb()).Mutex(n, dlock.WithCohort(0, time.Minute))
	require.NoError(t, m.Lock(ctx))
	first := m.Token()
	require.NoError(t, m.Extend(ctx, 5*time.Second))
	got := make(chan error, 1)
	go func() { got <- m.Lock(ctx) }()
	waitQueued(t, e, n, 1)
	require.NoError(t, m.Unlock(ctx))
	require.NoError(t, <-got)
	assert.Greater(t, m.Token(), first+1, "granted by Redis, with a token past the reserved block")
	require.NoError(t, m.Unlock(ctx))
}

// A Mutex cohorts by default: a goroutine waiting on the handle that holds
// the lock gets it from the Unlock, with the next reserved token and no
// round trip of its own, when the Unlock comes within DefaultCohortTime of
// the grant (five tries, so that one slow start of a goroutine does not
// decide). WithoutCohort sends it through the queue in Redis, where its
// grant follows the clock, never the reserved token.
func TestMutexCohort_OnByDefault_WithoutCohortGoesThroughRedis(t *testing.T) {
	e := sharedEnv(t)
	for _, tc := range []struct {
		name  string
		opts  []dlock.LockOption
		local bool
	}{
		{"default", nil, true},
		{"WithoutCohort", []dlock.LockOption{dlock.WithoutCohort()}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := name(t)
			ctx := ctxTimeout(t, 10*time.Second)
			m := e.client(e.rdb()).Mutex(n, tc.opts...)
			locals := 0
			for range 5 {
				require.NoError(t, m.Lock(ctx))
				first := m.Token()
				got := lockedToken(t, ctx, m)
				if tc.local {
					time.Sleep(2 * time.Millisecond) // the second Lock waits on the handle, sending nothing
				} else {
					waitQueued(t, e, n, 1)
				}
				require.NoError(t, m.Unlock(ctx))
				second := <-got
				require.Greater(t, second, first)
				if second == first+1 {
					locals++
				}
			}
			if tc.local {
				assert.Positive(t, locals, "no hold was handed on locally, with the token reserved")
			} else {
				assert.Zero(t, locals, "a hold was handed on locally")
			}
		})
	}
}

// A cohort spans the handles of one Client: a waiter on another handle of
// the name is handed the hold locally, with the next reserved token; a
// WithoutCohort handle of the name, and a handle on another Client, are
// served by Redis. The holder's time bound is generous: the test waits for
// the waiter to queue in Redis while it holds, which under -race can take
// longer than the default 10 ms.
func TestMutexCohort_AcrossHandlesOfOneClient(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 20*time.Second)
	c, other := e.client(e.rdb()), e.client(e.rdb())
	for _, tc := range []struct {
		name  string
		waits func() *dlock.Mutex
		local bool
	}{
		{"another handle", func() *dlock.Mutex { return c.Mutex(n) }, true},
		{"WithoutCohort handle", func() *dlock.Mutex { return c.Mutex(n, dlock.WithoutCohort()) }, false},
		{"handle on another Client", func() *dlock.Mutex { return other.Mutex(n) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for range 3 {
				h := c.Mutex(n, dlock.WithCohort(4, 10*time.Second))
				require.NoError(t, h.Lock(ctx))
				first := h.Token()
				w := tc.waits()
				got := make(chan uint64, 1)
				go func() {
					if err := w.Lock(ctx); err != nil {
						t.Error(err)
						got <- 0
						return
					}
					got <- w.Token()
				}()
				waitQueued(t, e, n, 1)
				if tc.local {
					// It queues in Redis on its first try, and joins the
					// Client's registry, where a local handoff finds it, after.
					require.Eventually(t, func() bool { return dlock.LocalWaiters(c) == 1 }, 5*time.Second, time.Millisecond)
				}
				require.NoError(t, h.Unlock(ctx))
				second := <-got
				require.Greater(t, second, first)
				assert.Equal(t, tc.local, second == first+1, "tokens %d then %d", first, second)
				assert.Zero(t, h.Token(), "the handle that passed the hold on holds nothing")
				require.NoError(t, w.Unlock(ctx))
				st, err := c.Mutex(n).Status(ctx)
				require.NoError(t, err)
				require.False(t, st.Held(), "the local holder's Unlock released the lock in Redis")
			}
		})
	}
}

// The usual way to use a Mutex, a new handle for every Lock, cohorts as a
// shared handle does: an exact counter, tokens strictly increasing, local
// handoffs within the default bound, and every goroutine served.
func TestMutexCohort_HandlePerLock_ExclusionAndTokens(t *testing.T) {
	e := realEnv(t)
	n := name(t)
	const clients, per, rounds = 2, 4, 30
	ctx := ctxTimeout(t, 60*time.Second)
	var handles []func() *dlock.Mutex
	for range clients {
		c := e.client(e.rdb())
		for range per {
			handles = append(handles, func() *dlock.Mutex { return c.Mutex(n) })
		}
	}
	rec, counter, served := lockRounds(t, ctx, handles, rounds)
	assert.EqualValues(t, clients*per*rounds, counter)
	for who, s := range served {
		assert.Equal(t, rounds, s, "goroutine %d", who)
	}
	local := checkTokens(t, rec.tokens, dlock.DefaultCohortHandoffs)
	t.Logf("%d acquisitions, %d handed on locally", len(rec.tokens), local)
	assert.Greater(t, local, len(rec.tokens)/3, "holds were handed on locally across handles")
}

// cohortRound is one handoff between two handles of the name: h locks, w
// (on h's Client) waits, queued in Redis and in the Client's registry, and
// h unlocks after holding for hold. It returns h's and w's tokens; w's is
// h's plus one only for a local handoff (a Redis grant goes past the block
// h's grant reserved).
func cohortRound(t *testing.T, ctx context.Context, e *env, c *dlock.Client, h, w *dlock.Mutex, n string, hold time.Duration, queued int64, before func()) (uint64, uint64) {
	t.Helper()
	require.NoError(t, h.Lock(ctx))
	first := h.Token()
	got := make(chan error, 1)
	go func() { got <- w.Lock(ctx) }()
	waitQueued(t, e, n, queued)
	require.Eventually(t, func() bool { return dlock.LocalWaiters(c) >= 1 }, 5*time.Second, time.Millisecond)
	if before != nil {
		before()
	}
	time.Sleep(hold)
	require.NoError(t, h.Unlock(ctx))
	require.NoError(t, <-got)
	second := w.Token()
	require.NoError(t, w.Unlock(ctx))
	require.Greater(t, second, first)
	return first, second
}

// confirmed waits until c's subscription to m's channel is confirmed: a
// waiter's Lock can return before it is, and a grant sent before the
// confirmation cannot count as quiet.
func confirmed(t *testing.T, c *dlock.Client, m *dlock.Mutex) {
	t.Helper()
	require.Eventually(t, func() bool { return dlock.ChannelConfirmed(c, m) }, 5*time.Second, time.Millisecond)
}

// Past the cohort's time bound, a hold whose Redis grant found nobody
// queued is handed on locally when still nobody else waits: the Client has
// been subscribed to the lock's channel since before the grant, and no
// other Client's waiter has been announced on it since. The first round
// goes through Redis: its grant came before the Client subscribed, so the
// Client cannot know whom it missed.
func TestMutexCohort_PastTheTimeBound_NobodyElseWaits_HandedOnLocally(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 20*time.Second)
	c := e.client(e.rdb())
	h, w := c.Mutex(n), c.Mutex(n) // default bounds: 4 handoffs, 10ms
	// Lock the name once from another Client, so that the rounds' grants
	// take the hot path (a new name's first grant does not), without
	// subscribing c.
	o := e.client(e.rdb()).Mutex(n)
	require.NoError(t, o.Lock(ctx))
	require.NoError(t, o.Unlock(ctx))
	first, second := cohortRound(t, ctx, e, c, h, w, n, 20*time.Millisecond, 1, nil)
	assert.NotEqual(t, first+1, second, "handed on locally, though the Client subscribed after the grant")
	confirmed(t, c, h)
	for round := range 3 {
		first, second := cohortRound(t, ctx, e, c, h, w, n, 20*time.Millisecond, 1, nil)
		assert.Equal(t, first+1, second, "round %d: not handed on locally past the time bound with nobody else waiting", round)
	}
}

// Past the cohort's time bound, a waiter of another Client keeps the bound:
// its try announces it on the lock's channel, and the hold goes back to
// Redis, where waiters are served in their order. Whether it queued before
// or after the holder's own Client's waiter: announcing the first waiter
// since the lock was free must not stop at one of the holder's own. A
// waiter on a handle WithoutCohort of the holder's own Client, which the
// cohort does not serve, keeps the bound too.
func TestMutexCohort_PastTheTimeBound_AnotherClientWaits_KeepsTheBound(t *testing.T) {
	e := sharedEnv(t)
	for _, tc := range []struct {
		name                string
		otherFirst, yOnSelf bool
	}{
		{"other Client queued first", true, false},
		{"own waiter queued first", false, false},
		{"own WithoutCohort handle queued first", true, true},
	} {
		otherFirst := tc.otherFirst
		t.Run(tc.name, func(t *testing.T) {
			n := name(t)
			ctx := ctxTimeout(t, 20*time.Second)
			c, other := e.client(e.rdb()), e.client(e.rdb())
			h, w, y := c.Mutex(n), c.Mutex(n), other.Mutex(n)
			local := 1 // c's waiters in its registry
			if tc.yOnSelf {
				// Not a cohorting handle: c's cohort would not serve it.
				y, local = c.Mutex(n, dlock.WithoutCohort()), 2
			}
			cohortRound(t, ctx, e, c, h, w, n, 0, 1, nil) // subscribes c
			confirmed(t, c, h)
			first, second := cohortRound(t, ctx, e, c, h, w, n, 20*time.Millisecond, 1, nil)
			require.Equal(t, first+1, second, "a quiet round past the bound was not handed on locally")

			require.NoError(t, h.Lock(ctx))
			first = h.Token()
			lock := func(m *dlock.Mutex, queued int64) <-chan uint64 {
				got := lockedToken(t, ctx, m)
				waitQueued(t, e, n, queued)
				return got
			}
			var yGot, wGot <-chan uint64
			if otherFirst {
				yGot, wGot = lock(y, 1), lock(w, 2)
			} else {
				wGot, yGot = lock(w, 1), lock(y, 2)
			}
			require.Eventually(t, func() bool { return dlock.LocalWaiters(c) == local }, 5*time.Second, time.Millisecond)
			time.Sleep(20 * time.Millisecond) // past the bound; the announcement reaches c
			require.NoError(t, h.Unlock(ctx))
			wTok, yTok := <-wGot, <-yGot
			require.NotZero(t, wTok)
			require.NotZero(t, yTok)
			assert.NotEqual(t, first+1, wTok, "handed on locally past the bound while another Client waited")
			if otherFirst {
				assert.Less(t, yTok, wTok, "y, queued first, is served first")
			} else {
				assert.Less(t, wTok, yTok, "w, queued first, is served first")
			}
		})
	}
}

// A Client whose pub/sub connection broke after a quiet grant cannot know
// who queued while it was down: past the time bound, the hold goes back to
// Redis.
func TestMutexCohort_PastTheTimeBound_PubSubKilled_GoesThroughRedis(t *testing.T) {
	e := realEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 20*time.Second)
	c := e.client(e.rdb())
	h, w := c.Mutex(n), c.Mutex(n)
	cohortRound(t, ctx, e, c, h, w, n, 0, 1, nil) // subscribes c
	confirmed(t, c, h)
	first, second := cohortRound(t, ctx, e, c, h, w, n, 20*time.Millisecond, 1, nil)
	require.Equal(t, first+1, second, "a quiet round past the bound was not handed on locally")
	first, second = cohortRound(t, ctx, e, c, h, w, n, 20*time.Millisecond, 1, func() {
		require.NoError(t, e.rdb().Do(ctx, "client", "kill", "type", "pubsub").Err())
	})
	assert.NotEqual(t, first+1, second, "handed on locally past the bound though the connection broke meanwhile")
}

// Past the time bound with nobody else waiting, a hold that a local handoff
// gave passes on locally too, each 20 ms after the last, but the handoff
// bound still holds: with the default 4, four holds follow the Redis grant
// with its next four tokens, and the fifth waiter is served through Redis,
// with a token of its own grant.
func TestMutexCohort_PastTheTimeBound_LocalHoldsPassOnUpToTheHandoffBound(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 20*time.Second)
	c := e.client(e.rdb())
	h := c.Mutex(n) // default bounds: 4 handoffs, 10ms
	require.Equal(t, 4, dlock.DefaultCohortHandoffs)
	o := e.client(e.rdb()).Mutex(n) // as in ..._NobodyElseWaits_HandedOnLocally
	require.NoError(t, o.Lock(ctx))
	require.NoError(t, o.Unlock(ctx))
	cohortRound(t, ctx, e, c, h, c.Mutex(n), n, 0, 1, nil) // subscribes c
	confirmed(t, c, h)
	require.NoError(t, h.Lock(ctx))
	first := h.Token()
	const waiters = 5
	tokens := make(chan uint64, waiters)
	var wg sync.WaitGroup
	defer wg.Wait() // their Unlocks, before the Client closes
	for range waiters {
		m := c.Mutex(n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !assert.NoError(t, m.Lock(ctx)) {
				tokens <- 0
				return
			}
			tokens <- m.Token()
			time.Sleep(20 * time.Millisecond)
			assert.NoError(t, m.Unlock(ctx))
		}()
	}
	waitQueued(t, e, n, waiters)
	require.Eventually(t, func() bool { return dlock.LocalWaiters(c) == waiters }, 5*time.Second, time.Millisecond)
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, h.Unlock(ctx))
	var got []uint64
	for range waiters {
		got = append(got, <-tokens)
	}
	assert.Equal(t, []uint64{first + 1, first + 2, first + 3, first + 4}, got[:4], "the four holds after the grant, in the order they held")
	assert.Greater(t, got[4], first+5, "the fifth hold was handed on locally past the handoff bound")
}

// A Lock on a fresh handle of the name, while a cohort of its Client runs
// on another handle, waits for a local handoff without a round trip: it
// neither tries nor queues in Redis. The cohort here runs as under
// contention: its hold came by a local handoff while another goroutine of
// the Client waited (the wait registry records where a cohort runs only
// while the Client has waiters for the name). Within the bound the fresh
// handles are served locally, with the grant's next tokens; past it the
// releasing Unlock queues them in Redis, in the same script, and they are
// served from there; either way at once, not after a fallback timer.
func TestMutexCohort_FreshHandlesWhileACohortRuns_WaitLocally(t *testing.T) {
	e := realEnv(t)
	for _, max := range []int{4, 1} {
		t.Run(fmt.Sprintf("bound %d", max), func(t *testing.T) {
			n := name(t)
			ctx := ctxTimeout(t, 20*time.Second)
			tries := &scriptCalls{s: scripts.ExclTry}
			c := e.client(e.rdb(tries))
			mk := func() *dlock.Mutex { return c.Mutex(n, dlock.WithCohort(max, time.Minute)) }
			h0, a, b := mk(), mk(), mk()
			require.NoError(t, h0.Lock(ctx))
			first := h0.Token()
			aLocked := make(chan error, 1)
			go func() { aLocked <- a.Lock(ctx) }() // tries and queues in Redis
			waitQueued(t, e, n, 1)
			// (a queues in Redis before it joins the Client's registry,
			// where the local handoff looks: b must come after it there.)
			require.Eventually(t, func() bool { return dlock.LocalWaiters(c) == 1 }, 5*time.Second, time.Millisecond)
			bGot := lockedToken(t, ctx, b) // queues behind a
			waitQueued(t, e, n, 2)
			require.Eventually(t, func() bool { return dlock.LocalWaiters(c) == 2 }, 5*time.Second, time.Millisecond)
			require.NoError(t, h0.Unlock(ctx))
			require.NoError(t, <-aLocked)
			require.Equal(t, first+1, a.Token(), "h0's hold was not handed to a locally")
			before := tries.n.Load()
			const waiters = 2 // with b, three handoffs after a's: within the bound of 4
			var got []<-chan uint64
			for range waiters {
				got = append(got, lockedToken(t, ctx, mk()))
			}
			require.Eventually(t, func() bool { return dlock.LocalWaiters(c) == 1+waiters }, 5*time.Second, time.Millisecond)
			time.Sleep(20 * time.Millisecond) // a try would have been sent by now
			assert.Equal(t, before, tries.n.Load(), "a Lock on a fresh handle tried in Redis while the cohort ran")
			// a's place, served, stays until the cohort's release; b's.
			assert.Equal(t, int64(2), e.rdb().ZCard(ctx, key(n)+":mq").Val(), "a Lock on a fresh handle queued in Redis")
			unlocked := time.Now()
			require.NoError(t, a.Unlock(ctx))
			tokens := []uint64{<-bGot}
			for _, ch := range got {
				tokens = append(tokens, <-ch)
			}
			served := time.Since(unlocked)
			assert.Less(t, served, time.Second, "the waiters were served by a fallback timer")
			require.NotContains(t, tokens, uint64(0))
			if max > 1 {
				// b, then the fresh handles: a's hold was the first local
				// handoff, these the next three.
				slices.Sort(tokens)
				assert.Equal(t, []uint64{first + 2, first + 3, first + 4}, tokens, "not handed on locally")
				assert.Equal(t, before, tries.n.Load(), "a local waiter tried in Redis")
			} else {
				assert.NotEqual(t, first+2, tokens[0], "b was handed a's hold past the handoff bound")
			}
			assert.Zero(t, e.rdb().ZCard(ctx, key(n)+":mq").Val(), "a place was left in Redis")
		})
	}
}

// Another Client's ForceUnlock takes a cohort's hold away. The holder's
// Client, subscribed to the lock's channel while its goroutines wait,
// reports the hold lost at once (not at its next renewal, a third of the
// watchdog timeout later), and hands nothing on locally: its waiter, on
// another handle, holds only after the holder was told, by a grant from
// Redis.
func TestMutexCohort_ForceUnlockElsewhere_HolderToldAtOnce_NothingHandedLocally(t *testing.T) {
	e := realEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 20*time.Second)
	c := e.client(e.rdb())
	mk := func() *dlock.Mutex { return c.Mutex(n, dlock.WithCohort(4, time.Minute)) }
	m := mk()
	require.NoError(t, m.Lock(ctx))
	first, lost := m.Token(), m.Lost()
	// A waiter on m's handle finds the cohort there, and records it for
	// the name; then one on a fresh handle finds it by the name, and the
	// first leaves.
	firstCtx, leave := context.WithCancel(ctx)
	left := make(chan error, 1)
	go func() { left <- m.Lock(firstCtx) }()
	require.Eventually(t, func() bool { return dlock.CohortRecorded(c, m) }, 5*time.Second, time.Millisecond)
	b := mk()
	type served struct {
		token uint64
		told  bool // the holder knew of its loss when the waiter returned
	}
	got := make(chan served, 1)
	go func() {
		assert.NoError(t, b.Lock(ctx)) // waits locally: the cohort runs
		s := served{token: b.Token()}
		select {
		case <-lost:
			s.told = true
		default:
		}
		got <- s
	}()
	require.Eventually(t, func() bool { return dlock.LocalWaiters(c) == 2 }, 5*time.Second, time.Millisecond)
	leave()
	require.ErrorIs(t, <-left, dlock.ErrNotObtained)
	require.Eventually(t, func() bool { return dlock.ChannelConfirmed(c, m) }, 5*time.Second, time.Millisecond)
	assert.Zero(t, e.rdb().ZCard(ctx, key(n)+":mq").Val(), "a local waiter queued in Redis")

	released, err := e.client(e.rdb()).Mutex(n).ForceUnlock(ctx)
	require.NoError(t, err)
	require.True(t, released)
	within(t, lost, time.Second, "the holder's loss")
	select {
	case s := <-got:
		assert.True(t, s.told, "the waiter held before the holder was told of its loss")
		assert.Greater(t, s.token, first+dlock.DefaultCohortHandoffs, "the lost hold was handed on locally, or its reserved tokens reused")
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter was not served after the force")
	}
	require.NoError(t, b.Unlock(ctx))
	assert.ErrorIs(t, m.Unlock(ctx), dlock.ErrLost, "the lost hold's Unlock")
}

// servedLocallyWithAPlace makes a cohort whose hold m2 has from a local
// handoff, served while it had a place in the queue in Redis (it tried
// before the cohort was recorded for the name): that place stays queued,
// unclaimed, until the cohort ends.
func servedLocallyWithAPlace(t *testing.T, ctx context.Context, e *env, c *dlock.Client, n string) (m2 *dlock.Mutex) {
	t.Helper()
	// A long time bound: the first grant of a name is not a quiet one, so
	// past the bound nothing would be handed on.
	m1, m2 := c.Mutex(n, dlock.WithCohort(4, time.Minute)), c.Mutex(n, dlock.WithCohort(4, time.Minute))
	require.NoError(t, m1.Lock(ctx))
	locked := make(chan error, 1)
	go func() { locked <- m2.Lock(ctx) }() // no cohort recorded for the name yet: it tries and queues
	waitQueued(t, e, n, 1)
	require.Eventually(t, func() bool { return dlock.LocalWaiters(c) == 1 }, 5*time.Second, time.Millisecond)
	first := m1.Token()
	require.NoError(t, m1.Unlock(ctx)) // handed on locally
	require.NoError(t, <-locked)
	require.Equal(t, first+1, m2.Token(), "not handed on locally")
	require.Equal(t, int64(1), e.rdb().ZCard(ctx, key(n)+":mq").Val(), "the served waiter's place is not in the queue")
	return m2
}

// requireFreeSoon fails unless lock n is free, with nobody queued, within a
// second: a place left queued that a grant reached holds it up to its
// waiting mark's lease (seconds).
func requireFreeSoon(t *testing.T, ctx context.Context, e *env, n string) {
	t.Helper()
	rdb := e.rdb()
	require.Eventually(t, func() bool { // ('o' names the holder, or an RWMutex's writer; ':rl' its readers)
		held, err := rdb.HExists(ctx, key(n), "o").Result()
		return err == nil && !held && rdb.ZCard(ctx, key(n)+":mq").Val() == 0 && rdb.ZCard(ctx, key(n)+":rl").Val() == 0
	}, time.Second, 5*time.Millisecond, "the lock is held, or a place queued, after the cohort ended: %v %v",
		rdb.HGetAll(ctx, key(n)).Val(), rdb.ZRangeWithScores(ctx, key(n)+":mq", 0, -1).Val())
}

// A cohort whose hold is lost drops the places of the waiters it served,
// which its release would have dropped: the lock is not handed to them.
// Here a ForceUnlock on the Client's own handle hands the lock to the
// served waiter's place, first in the queue, and reports the hold lost.
func TestMutexCohort_HoldLost_ServedPlacesDropped(t *testing.T) {
	e := realEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 20*time.Second)
	c := e.client(e.rdb())
	m := servedLocallyWithAPlace(t, ctx, e, c, n)
	released, err := m.ForceUnlock(ctx)
	require.NoError(t, err)
	require.True(t, released)
	requireFreeSoon(t, ctx, e, n)
	assert.ErrorIs(t, m.Unlock(ctx), dlock.ErrLost)
}

// A cohort hold handed over drops the places of the waiters its cohort
// served: the hold's release by its HoldRef would hand the lock to them.
func TestMutexCohort_HandOver_ServedPlacesDropped(t *testing.T) {
	e := realEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 20*time.Second)
	c := e.client(e.rdb())
	m := servedLocallyWithAPlace(t, ctx, e, c, n)
	ref, err := m.HandOver()
	require.NoError(t, err)
	require.NoError(t, e.client(e.rdb()).ReleaseRef(ctx, ref))
	requireFreeSoon(t, ctx, e, n)
}
