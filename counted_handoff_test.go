package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock"
)

// Counted locks (ReentrantMutex, RWMutex writers) run on the Mutex's
// engine: each acquisition a grant of its own ID, handed over claimed (the
// release makes the first waiter the holder with count 1, and the waiter
// holds from the release message alone), and handed between the owners of
// one Client locally (lock cohorting).

// countedLock is the write side of a ReentrantMutex or an RWMutex.
type countedLock interface {
	Lock(ctx context.Context) error
	Unlock(ctx context.Context) error
	Token(ctx context.Context) uint64
	Lost(ctx context.Context) <-chan struct{}
	HoldContext(ctx context.Context) (context.Context, context.CancelFunc)
	ForceUnlock(ctx context.Context) (bool, error)
}

type countedKind struct {
	name string
	with func(c *dlock.Client, n string, opts ...dlock.LockOption) countedLock
	// confirmed reports whether c's pub/sub connection has a confirmed
	// subscription to l's channel.
	confirmed func(c *dlock.Client, l countedLock) bool
}

func (k countedKind) open(c *dlock.Client, n string) countedLock { return k.with(c, n) }

var countedKinds = []countedKind{
	{"ReentrantMutex",
		func(c *dlock.Client, n string, opts ...dlock.LockOption) countedLock {
			return c.ReentrantMutex(n, opts...)
		},
		func(c *dlock.Client, l countedLock) bool {
			return dlock.ReentrantChannelConfirmed(c, l.(*dlock.ReentrantMutex))
		}},
	{"RWMutex",
		func(c *dlock.Client, n string, opts ...dlock.LockOption) countedLock { return c.RWMutex(n, opts...) },
		func(c *dlock.Client, l countedLock) bool { return dlock.RWChannelConfirmed(c, l.(*dlock.RWMutex)) }},
}

// countedHolder returns the owner ID holding the write side of lock n and
// its count.
func countedHolder(t *testing.T, ctx context.Context, e *env, n string) (string, string) {
	t.Helper()
	v, err := e.rdb().HMGet(ctx, key(n), "o", "n").Result()
	require.NoError(t, err)
	o, _ := v[0].(string)
	c, _ := v[1].(string)
	return o, c
}

func TestCountedHandoff_WaiterHoldsFromTheMessage_SendsNothing(t *testing.T) {
	for _, k := range countedKinds {
		t.Run(k.name, func(t *testing.T) {
			e := sharedEnv(t)
			probe := e.rdb()
			n := name(t)
			ctx := ctxTimeout(t, 30*time.Second)
			hctx, wctx := dlock.WithNewOwner(ctx), dlock.WithNewOwner(ctx)
			holder := k.open(e.client(e.rdb()), n)
			cnt := newCounter()
			waiter := k.open(e.client(e.rdb(cnt)), n)
			require.NoError(t, holder.Lock(hctx))
			done := make(chan error, 1)
			go func() { done <- waiter.Lock(wctx) }()
			require.Eventually(t, func() bool { return len(queued(t, probe, n)) == 1 }, 5*time.Second, time.Millisecond)
			time.Sleep(20 * time.Millisecond) // let the queueing try's reply arrive
			held := holder.Token(hctx)
			cnt.reset()
			require.NoError(t, holder.Unlock(hctx))
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(5 * time.Second):
				t.Fatal("the waiter did not acquire")
			}
			trips, cmds := cnt.snapshot()
			assert.Zero(t, trips, "the waiter holds from the release message alone, sending nothing: %v", cmds)
			_, count := countedHolder(t, ctx, e, n)
			assert.Equal(t, "1", count, "handed over claimed, with count 1")
			assert.Greater(t, waiter.Token(wctx), held, "the handed hold has its own token")

			// Re-entry and release work on the handed hold as on any other.
			require.NoError(t, waiter.Lock(wctx))
			_, count = countedHolder(t, ctx, e, n)
			assert.Equal(t, "2", count)
			require.NoError(t, waiter.Unlock(wctx))
			require.NoError(t, waiter.Unlock(wctx))
			assert.Empty(t, holderOf(t, probe, n), "released after as many Unlocks as Locks")
			require.ErrorIs(t, waiter.Unlock(wctx), dlock.ErrNotHeld)
		})
	}
}

// The round trips of every Client, over a contended run of several Clients
// and goroutines: a contended acquisition costs its queueing try and its
// Unlock, and nothing more (3 before hand-overs were claimed: the claiming
// try besides). As in the bench, each Client runs 4 goroutines, so that a
// Lock mostly finds another of its Client's calls waiting and goes to the
// wait without a first try (a Lock that tries first and queues looks once
// more when it joins the wait, whatever the primitive). A first phase warms
// connections and subscriptions, whose confirmations make every waiter
// look again; the second is counted.
func TestCountedHandoff_Contended_AtMostTwoRoundTripsPerHandoff(t *testing.T) {
	for _, k := range countedKinds {
		t.Run(k.name, func(t *testing.T) {
			e := realEnv(t)
			n := name(t)
			ctx := ctxTimeout(t, 60*time.Second)
			const clients, per = 2, 4
			cnt := newCounter()
			var locks []countedLock
			for range clients {
				c := e.client(e.rdb(cnt))
				for range per {
					locks = append(locks, k.open(c, n))
				}
			}
			var owners []context.Context
			for range locks {
				owners = append(owners, dlock.WithNewOwner(ctx))
			}
			var inside atomic.Int32
			var acquired atomic.Int64
			run := func(rounds int) {
				var wg sync.WaitGroup
				for i, m := range locks {
					wg.Go(func() {
						for range rounds {
							if err := m.Lock(owners[i]); err != nil {
								t.Error(err)
								return
							}
							if inside.Add(1) != 1 {
								t.Error("two holders at once")
							}
							acquired.Add(1)
							time.Sleep(time.Millisecond)
							inside.Add(-1)
							if err := m.Unlock(owners[i]); err != nil {
								t.Error(err)
							}
						}
					})
				}
				wg.Wait()
			}
			run(10)
			cnt.reset()
			acquired.Store(0)
			start := time.Now()
			run(40)
			elapsed := time.Since(start)
			trips, cmds := cnt.snapshot()
			perAcq := float64(trips) / float64(acquired.Load())
			t.Logf("%d acquisitions in %v, %d round trips: %.2f each; %v", acquired.Load(), elapsed, trips, perAcq, cmds)
			require.EqualValues(t, len(locks)*40, acquired.Load())
			assert.LessOrEqual(t, perAcq, 2.1, "round trips per acquisition")
		})
	}
}

// A waiter whose ctx ends as the lock is handed to it does not keep the
// hold: it gives it back, and the next waiter, on another Client, gets the
// lock at once, not when the hand-over's lease or mark runs out. The
// holder is on the waiter's Client, so that its Unlock wakes the waiter
// directly, and the cancel lands at moments around the Unlock that vary by
// round: before the hand-over, as it is handed, after it took it.
func TestCountedHandoff_CancelledAsHanded_GivesTheLockBack(t *testing.T) {
	for _, k := range countedKinds {
		t.Run(k.name, func(t *testing.T) {
			e := sharedEnv(t)
			probe := e.rdb()
			ctx := ctxTimeout(t, 60*time.Second)
			c := e.client(e.rdb())
			other := e.client(e.rdb())
			for i := range 15 {
				n := fmt.Sprintf("%s-%d", name(t), i)
				hctx, wctx, nctx := dlock.WithNewOwner(ctx), dlock.WithNewOwner(ctx), dlock.WithNewOwner(ctx)
				holder, waiter, next := k.open(c, n), k.open(c, n), k.open(other, n)
				require.NoError(t, holder.Lock(hctx))
				cctx, cancel := context.WithCancel(wctx)
				werr := make(chan error, 1)
				go func() { werr <- waiter.Lock(cctx) }()
				require.Eventually(t, func() bool { return len(queued(t, probe, n)) == 1 }, 5*time.Second, time.Millisecond)
				nerr := make(chan error, 1)
				go func() { nerr <- next.Lock(nctx) }()
				require.Eventually(t, func() bool { return len(queued(t, probe, n)) == 2 }, 5*time.Second, time.Millisecond)
				time.Sleep(5 * time.Millisecond)
				// The cancel lands at varying moments around the Unlock.
				go func() {
					time.Sleep(time.Duration(i) * 40 * time.Microsecond)
					cancel()
				}()
				require.NoError(t, holder.Unlock(hctx))
				err := <-werr
				if err == nil {
					// It took the hold before it saw its ctx end: a hold it
					// must release, as any caller whose Lock returned nil.
					require.NoError(t, waiter.Unlock(wctx))
				} else {
					require.ErrorIs(t, err, dlock.ErrNotObtained)
					require.ErrorIs(t, err, context.Canceled)
					assert.Zero(t, waiter.Token(wctx), "the cancelled waiter holds nothing")
				}
				start := time.Now()
				select {
				case err := <-nerr:
					require.NoError(t, err)
				case <-time.After(2 * time.Second):
					t.Fatalf("round %d: the next waiter did not get the lock; holder %q", i, holderOf(t, probe, n))
				}
				assert.Less(t, time.Since(start), time.Second, "the lock went on at once")
				owner, count := countedHolder(t, ctx, e, n)
				assert.True(t, strings.HasPrefix(owner, other.ID()+"."), "the next waiter holds: %q", owner)
				assert.Equal(t, "1", count)
				require.NoError(t, next.Unlock(nctx))
				assert.Empty(t, holderOf(t, probe, n))
			}
		})
	}
}

// Two calls of one owner blocked on the lock, each with a place of its own:
// the hand-over to either lets both in, one holding and one re-entering
// (it leaves its place), and the lock is released after both Unlocks.
func TestCountedHandoff_TwoCallsOfOneOwner_BothGetIn(t *testing.T) {
	for _, k := range countedKinds {
		t.Run(k.name, func(t *testing.T) {
			e := sharedEnv(t)
			probe := e.rdb()
			n := name(t)
			ctx := ctxTimeout(t, 30*time.Second)
			hctx, octx := dlock.WithNewOwner(ctx), dlock.WithNewOwner(ctx)
			holder := k.open(e.client(e.rdb()), n)
			c := e.client(e.rdb())
			require.NoError(t, holder.Lock(hctx))
			errs := make(chan error, 2)
			for range 2 {
				go func() { errs <- k.open(c, n).Lock(octx) }()
			}
			// Each call queues under a grant ID of its own (a
			// ReentrantMutex's, and an RWMutex's writers').
			require.Eventually(t, func() bool { return len(queued(t, probe, n)) == 2 }, 5*time.Second, time.Millisecond)
			time.Sleep(50 * time.Millisecond) // both calls wait
			require.NoError(t, holder.Unlock(hctx))
			for range 2 {
				select {
				case err := <-errs:
					require.NoError(t, err)
				case <-time.After(5 * time.Second):
					t.Fatal("a call of the owner did not get in")
				}
			}
			owner, count := countedHolder(t, ctx, e, n)
			assert.True(t, strings.HasPrefix(owner, c.ID()+"."))
			assert.Equal(t, "2", count, "one hold and one re-entry")
			m := k.open(c, n)
			require.NoError(t, m.Unlock(octx))
			assert.NotEmpty(t, holderOf(t, probe, n))
			require.NoError(t, m.Unlock(octx))
			assert.Empty(t, holderOf(t, probe, n))
		})
	}
}

// Exclusion and tokens under contention with mixed owners, re-entry and
// hand-overs within and across Clients: an exact counter, and each owner's
// tokens strictly increasing along the order of holds.
func TestCountedHandoff_MixedOwnersAndReentry_ExactCounter(t *testing.T) {
	for _, k := range countedKinds {
		t.Run(k.name, func(t *testing.T) {
			e := sharedEnv(t)
			n := name(t)
			ctx := ctxTimeout(t, 60*time.Second)
			const clients, per, rounds = 3, 3, 20
			var counter atomic.Int64
			var mu sync.Mutex
			var tokens []uint64
			var wg sync.WaitGroup
			for range clients {
				c := e.client(e.rdb())
				for range per {
					wg.Go(func() {
						octx := dlock.WithNewOwner(ctx)
						for r := range rounds {
							m := k.open(c, n)
							if err := m.Lock(octx); err != nil {
								t.Error(err)
								return
							}
							if r%2 == 0 { // re-enter through another handle
								if err := k.open(c, n).Lock(octx); err != nil {
									t.Error(err)
									return
								}
							}
							v := counter.Load() // a lost update shows if exclusion fails
							time.Sleep(300 * time.Microsecond)
							counter.Store(v + 1)
							mu.Lock()
							tokens = append(tokens, m.Token(octx))
							mu.Unlock()
							if r%2 == 0 {
								if err := m.Unlock(octx); err != nil {
									t.Error(err)
								}
							}
							if err := m.Unlock(octx); err != nil {
								t.Error(err)
							}
						}
					})
				}
			}
			wg.Wait()
			assert.EqualValues(t, clients*per*rounds, counter.Load())
			for i := 1; i < len(tokens); i++ {
				if tokens[i] <= tokens[i-1] {
					t.Errorf("token %d (%d) not above the one before (%d)", i, tokens[i], tokens[i-1])
					break
				}
			}
			assert.Empty(t, holderOf(t, e.rdb(), n))
		})
	}
}

// A writer's hand-over respects the RWMutex's fairness: a writer's release
// hands the lock to every reader queued before the next writer, and the
// last reader out hands it to that writer, claimed.
func TestCountedHandoff_RWMutexWriterAfterReaders_HandedClaimed(t *testing.T) {
	e := sharedEnv(t)
	probe := e.rdb()
	n := name(t)
	ctx := ctxTimeout(t, 30*time.Second)
	wctx, rctx, w2ctx := dlock.WithNewOwner(ctx), dlock.WithNewOwner(ctx), dlock.WithNewOwner(ctx)
	a, b := e.client(e.rdb()), e.client(e.rdb())
	require.NoError(t, a.RWMutex(n).Lock(wctx))
	rdone := make(chan error, 1)
	go func() { rdone <- b.RWMutex(n).RLock(rctx) }()
	require.Eventually(t, func() bool { return len(queued(t, probe, n)) == 1 }, 5*time.Second, time.Millisecond)
	w2done := make(chan error, 1)
	go func() { w2done <- b.RWMutex(n).Lock(w2ctx) }()
	require.Eventually(t, func() bool { return len(queued(t, probe, n)) == 2 }, 5*time.Second, time.Millisecond)
	require.NoError(t, a.RWMutex(n).Unlock(wctx))
	require.NoError(t, <-rdone, "the reader queued first goes first")
	select {
	case err := <-w2done:
		t.Fatalf("the second writer got in while a reader holds: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	require.NoError(t, b.RWMutex(n).RUnlock(rctx))
	require.NoError(t, <-w2done)
	owner, count := countedHolder(t, ctx, e, n)
	assert.True(t, strings.HasPrefix(owner, b.ID()+"."))
	assert.Equal(t, "1", count)
	require.NoError(t, b.RWMutex(n).Unlock(w2ctx))
	assert.Empty(t, holderOf(t, probe, n))
	err := b.RWMutex(n).Unlock(w2ctx)
	assert.True(t, errors.Is(err, dlock.ErrNotHeld), "%v", err)
}

// A waiter whose Client died is handed the lock claimed like any other; the
// hold lasts what remained of its waiting mark, and then the next waiter
// gets the lock: nobody holds it past the dead waiter's mark, and nobody
// else holds it before.
func TestCountedHandoff_DeadWaiterFirst_HoldsOnlyUntilItsMarkEnds(t *testing.T) {
	for _, k := range []struct {
		countedKind
		ghost string // the dead waiter's place
	}{{countedKinds[0], "0:ghost.o.x"}, {countedKinds[1], "0:wghost.o.x"}} {
		t.Run(k.name, func(t *testing.T) {
			e := sharedEnv(t)
			probe := e.rdb()
			n := name(t)
			ctx := ctxTimeout(t, 30*time.Second)
			hctx, wctx := dlock.WithNewOwner(ctx), dlock.WithNewOwner(ctx)
			// Short leases so the live waiter's fallback timer is short too.
			holder := k.open(e.client(e.rdb(), dlock.WithWatchdogTimeout(time.Second)), n)
			waiter := k.open(e.client(e.rdb(), dlock.WithWatchdogTimeout(time.Second)), n)
			require.NoError(t, holder.Lock(hctx))
			const ghostMark = 800 * time.Millisecond
			addGhost(t, probe, n, strings.TrimPrefix(k.ghost, "0:"), ghostMark)
			done := make(chan error, 1)
			go func() { done <- waiter.Lock(wctx) }()
			require.Eventually(t, func() bool { return len(queued(t, probe, n)) == 2 }, 5*time.Second, time.Millisecond)
			released := time.Now()
			require.NoError(t, holder.Unlock(hctx))
			owner, count := countedHolder(t, ctx, e, n)
			assert.Equal(t, "ghost.o.x", owner, "handed to the first in line")
			assert.Equal(t, "1", count, "claimed")
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(5 * time.Second):
				t.Fatal("the live waiter did not acquire once the dead waiter's hold ran out")
			}
			waited := time.Since(released)
			assert.Greater(t, waited, ghostMark/2, "exclusion holds while the dead waiter's hold lasts")
			t.Logf("a dead waiter at the head held the lock up for %v (its mark had %v left)", waited, ghostMark)
			require.NoError(t, waiter.Unlock(wctx))
			assert.Empty(t, holderOf(t, probe, n))
		})
	}
}
