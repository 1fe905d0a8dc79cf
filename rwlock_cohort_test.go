package dlock_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock"
)

// An RWMutex's writers run on the ReentrantMutex's engine (internal/engine's
// reentrant.go, over the rw_*.lua scripts): Redis names a write hold by its
// grant ID, and an owner's last Unlock hands the write hold to a writer of
// the same Client without a round trip, within the cohort's bounds. The
// tests both kinds share (a ForceUnlock elsewhere, Close, a partition) are
// TestCountedCohort_* in reentrant_cohort_test.go.

// Four Clients, four writers on each (one owner per goroutine), each
// re-entering once per hold, and a reader per Client: an exact counter, no
// reader inside a write, one token per write hold strictly increasing
// across holds, local handoffs between writers, and everyone served.
func TestRWCohort_WritersExclude_TokensIncrease_LocalHandoffs(t *testing.T) {
	e := realEnv(t)
	n := name(t)
	const clients, per, rounds = 4, 4, 20
	ctx := ctxTimeout(t, 60*time.Second)
	rec := &cohortRecord{}
	served := make([]int, clients*per)
	var writers, readers, counter atomic.Int64
	var plain int64 // written under the write lock only
	var wg sync.WaitGroup
	for ci := range clients {
		c := e.client(e.rdb())
		for gi := range per {
			who := ci*per + gi
			rw := c.RWMutex(n)
			octx := dlock.WithNewOwner(ctx)
			wg.Go(func() {
				for range rounds {
					if err := rw.Lock(octx); err != nil {
						t.Error(err)
						return
					}
					token := rw.Token(octx)
					if err := rw.Lock(octx); err != nil { // re-entry
						t.Error(err)
						return
					}
					if writers.Add(1) != 1 || readers.Load() != 0 {
						t.Error("a writer held beside another writer or a reader")
					}
					v := plain
					time.Sleep(200 * time.Microsecond)
					plain = v + 1
					if got := rw.Token(octx); got != token {
						t.Errorf("re-entry changed the token from %d to %d", token, got)
					}
					rec.add(who, token)
					served[who]++
					writers.Add(-1)
					for range 2 {
						if err := rw.Unlock(octx); err != nil {
							t.Error(err)
						}
					}
				}
			})
		}
		rctx := dlock.WithNewOwner(ctx)
		rw := c.RWMutex(n)
		wg.Go(func() {
			for range rounds / 2 {
				if err := rw.RLock(rctx); err != nil {
					t.Error(err)
					return
				}
				readers.Add(1)
				if writers.Load() != 0 {
					t.Error("a reader held beside a writer")
				}
				counter.Add(1)
				time.Sleep(100 * time.Microsecond)
				readers.Add(-1)
				if err := rw.RUnlock(rctx); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	assert.EqualValues(t, clients*per*rounds, plain)
	assert.EqualValues(t, clients*rounds/2, counter.Load())
	local := checkTokens(t, rec.tokens, dlock.DefaultCohortHandoffs)
	t.Logf("%d write holds, %d handed on locally", len(rec.tokens), local)
	assert.Positive(t, local, "no write hold was handed to another writer locally")
	for who, s := range served {
		assert.Equal(t, rounds, s, "writer %d", who)
	}
	requireFreeSoon(t, ctx, e, n)
}

// Writer a's last Unlock hands the write lock to writer b waiting on the
// same Client without a round trip (the next token of the grant's block),
// and to one on another Client through Redis. b then re-enters, counted in
// Redis too, and may read (downgrade) under its own grant.
func TestRWCohort_LastUnlockHandsToAnotherWriterOfTheClient(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 20*time.Second)
	c, other := e.client(e.rdb()), e.client(e.rdb())
	for _, tc := range []struct {
		name  string
		on    *dlock.Client
		local bool
	}{{"writer on the same Client", c, true}, {"writer on another Client", other, false}} {
		t.Run(tc.name, func(t *testing.T) {
			a, actx := c.RWMutex(n, dlock.WithCohort(4, time.Minute)), dlock.WithOwner(ctx, "a")
			b, bctx := tc.on.RWMutex(n), dlock.WithOwner(ctx, "b")
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
				t.Fatal("b wrote while a still held once")
			case <-time.After(50 * time.Millisecond):
			}
			require.NoError(t, a.Unlock(actx))
			require.NoError(t, <-done)
			assert.Equal(t, tc.local, b.Token(bctx) == first+1, "tokens %d then %d", first, b.Token(bctx))
			assert.Zero(t, a.Token(actx), "a holds nothing after its last Unlock")
			assert.ErrorIs(t, a.Unlock(actx), dlock.ErrNotHeld)
			ok, err := a.TryRLock(actx)
			require.NoError(t, err)
			assert.False(t, ok, "a read while b writes")

			require.NoError(t, b.Lock(bctx))
			assert.Equal(t, "2", e.rdb().HGet(ctx, key(n), "n").Val(), "Redis counts b's holds")
			ok, err = b.TryRLock(bctx)
			require.NoError(t, err)
			assert.True(t, ok, "the writer may read (downgrade)")
			require.NoError(t, b.Unlock(bctx))
			require.NoError(t, b.Unlock(bctx))
			require.NoError(t, b.RUnlock(bctx))
			requireFreeSoon(t, ctx, e, n)
		})
	}
}

// A reader of another Client queued behind a writer cohort gets the lock
// when the cohort releases to Redis, after at most its bound of local
// handoffs, and before any writer that comes after the cohort: the writers
// of the cohort's Client cannot starve it.
func TestRWCohort_ReaderElsewhere_ServedWhenTheCohortEnds(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 20*time.Second)
	c, other := e.client(e.rdb()), e.client(e.rdb())
	const bound = 2
	mk := func() *dlock.RWMutex { return c.RWMutex(n, dlock.WithCohort(bound, time.Minute)) }
	h, hctx := mk(), dlock.WithNewOwner(ctx)
	require.NoError(t, h.Lock(hctx))
	// Writers of c, one per owner, waiting locally for the cohort.
	var writes atomic.Int64
	var readerIn atomic.Bool
	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	const waiting = 4
	for range waiting {
		w, wctx := mk(), dlock.WithNewOwner(ctx)
		wg.Go(func() {
			if err := w.Lock(wctx); err != nil {
				t.Error(err)
				return
			}
			if readerIn.Load() {
				t.Error("a writer held beside the reader")
			}
			mu.Lock()
			order = append(order, "w")
			mu.Unlock()
			writes.Add(1)
			time.Sleep(2 * time.Millisecond)
			if err := w.Unlock(wctx); err != nil {
				t.Error(err)
			}
		})
	}
	require.Eventually(t, func() bool { return dlock.LocalWaiters(c) == waiting }, 5*time.Second, time.Millisecond)
	r, rctx := other.RWMutex(n), dlock.WithNewOwner(ctx)
	read := make(chan error, 1)
	go func() {
		err := r.RLock(rctx)
		if err == nil {
			readerIn.Store(true)
			mu.Lock()
			order = append(order, "r")
			mu.Unlock()
			time.Sleep(5 * time.Millisecond)
			readerIn.Store(false)
			err = r.RUnlock(rctx)
		}
		read <- err
	}()
	waitQueued(t, e, n, 1)
	require.NoError(t, h.Unlock(hctx))
	require.NoError(t, <-read)
	wg.Wait()
	assert.EqualValues(t, waiting, writes.Load())
	// h's grant, then at most bound local handoffs, then the reader, who
	// queued before the cohort's remaining writers did (its release queued
	// them behind it).
	require.Len(t, order, waiting+1)
	at := -1
	for i, who := range order {
		if who == "r" {
			at = i
		}
	}
	t.Logf("order: %v", order)
	assert.LessOrEqual(t, at, bound, "the reader waited past the cohort's bound: %v", order)
	requireFreeSoon(t, ctx, e, n)
}

// An owner that writes and reads (it downgraded) does not hand the write
// hold to another writer of its Client when it unlocks the write: it still
// reads. The other writer gets the lock once the read ends, through Redis.
// Nor is a write hold handed locally to an owner that reads.
func TestRWCohort_OwnerThatReads_NoLocalHandoff(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 20*time.Second)
	c := e.client(e.rdb())
	a, actx := c.RWMutex(n, dlock.WithCohort(4, time.Minute)), dlock.WithOwner(ctx, "a")
	b, bctx := c.RWMutex(n, dlock.WithCohort(4, time.Minute)), dlock.WithOwner(ctx, "b")
	require.NoError(t, a.Lock(actx))
	first := a.Token(actx)
	require.NoError(t, a.RLock(actx)) // downgrade
	wrote := make(chan error, 1)
	go func() { wrote <- b.Lock(bctx) }()
	require.Eventually(t, func() bool { return dlock.LocalWaiters(c) == 1 }, 5*time.Second, time.Millisecond)
	require.NoError(t, a.Unlock(actx))
	select {
	case err := <-wrote:
		t.Fatalf("b wrote while a reads (%v)", err)
	case <-time.After(100 * time.Millisecond):
	}
	require.NoError(t, a.RUnlock(actx))
	select {
	case err := <-wrote:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("b never wrote after a's read ended")
	}
	assert.Greater(t, b.Token(bctx), first+4, "b's grant came from Redis, past a's reserved tokens")

	// b writes; a (no hold) waits to write; b reads, then unlocks the write.
	require.NoError(t, b.RLock(bctx))
	go func() { wrote <- a.Lock(actx) }()
	require.Eventually(t, func() bool { return dlock.LocalWaiters(c) == 1 }, 5*time.Second, time.Millisecond)
	require.NoError(t, b.Unlock(bctx))
	select {
	case err := <-wrote:
		t.Fatalf("a wrote while b reads (%v)", err)
	case <-time.After(100 * time.Millisecond):
	}
	require.NoError(t, b.RUnlock(bctx))
	require.NoError(t, <-wrote)
	require.NoError(t, a.Unlock(actx))
	requireFreeSoon(t, ctx, e, n)
}

// An owner with two calls waiting behind a writer of another Client: the
// second, a read, gives up. If the first writes, the read's place goes (the
// write call has a place of its own): once, it stayed, the writer's release
// handed it the read, and the owner's Lock then failed with ErrUpgrade,
// having never read. If the first reads too, the place they share stays for
// it. Either way the first call gets the lock once the writer leaves.
func TestRWMutex_ReadCallGivesUpBesideAnotherCallOfItsOwner(t *testing.T) {
	for _, write := range []bool{true, false} {
		t.Run(map[bool]string{true: "the other call writes", false: "the other call reads"}[write], func(t *testing.T) {
			e := sharedEnv(t)
			n := name(t)
			ctx := ctxTimeout(t, 20*time.Second)
			c, other := e.client(e.rdb()), e.client(e.rdb())
			x, xctx := other.RWMutex(n), dlock.WithOwner(ctx, "x")
			require.NoError(t, x.Lock(xctx))
			b, bctx := c.RWMutex(n), dlock.WithOwner(ctx, "b")
			first := make(chan error, 1)
			go func() {
				if write {
					first <- b.Lock(bctx)
				} else {
					first <- b.RLock(bctx)
				}
			}()
			waitQueued(t, e, n, 1)
			rctx, cancel := context.WithTimeout(bctx, 200*time.Millisecond)
			defer cancel()
			require.ErrorIs(t, b.RLock(rctx), dlock.ErrNotObtained)
			assert.Len(t, e.rdb().ZRange(ctx, key(n)+":mq", 0, -1).Val(), 1, "one place, the first call's")
			require.NoError(t, x.Unlock(xctx))
			select {
			case err := <-first:
				require.NoError(t, err, "b's first call failed (an ErrUpgrade: b never read)")
			case <-time.After(5 * time.Second):
				t.Fatal("b's first call did not return")
			}
			if write {
				require.NoError(t, b.Unlock(bctx))
			} else {
				require.NoError(t, b.RUnlock(bctx))
			}
			requireFreeSoon(t, ctx, e, n)
		})
	}
}

// A read handed to an owner and not claimed yet (read count 0, as a
// writer's release leaves it for every reader queued) is no read hold: the
// owner's write try waits behind it rather than failing with ErrUpgrade,
// since the owner's read call may still give it up. A claimed read (count
// 1) makes the write try fail with ErrUpgrade.
func TestRWMutex_ReadHandedNotClaimed_WriteWaitsNotUpgrade(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 10*time.Second)
	c, rdb := e.client(e.rdb()), e.rdb()
	b, bctx := c.RWMutex(n), dlock.WithOwner(ctx, "b")
	owner := c.ID() + ".o.b"
	now, err := rdb.Time(ctx).Result()
	require.NoError(t, err)
	require.NoError(t, rdb.HSet(ctx, key(n), "k", "rwlock").Err())
	require.NoError(t, rdb.ZAdd(ctx, key(n)+":rl", redis.Z{Score: float64(now.Add(10 * time.Second).UnixMilli()), Member: owner}).Err())
	require.NoError(t, rdb.HSet(ctx, key(n)+":rc", owner, 0).Err())
	ok, err := b.TryLock(bctx)
	require.NoError(t, err, "an unclaimed read handed to the owner made its write try an upgrade")
	assert.False(t, ok, "a writer held beside a reader")
	require.NoError(t, rdb.HSet(ctx, key(n)+":rc", owner, 1).Err())
	_, err = b.TryLock(bctx)
	require.ErrorIs(t, err, dlock.ErrUpgrade)
	require.NoError(t, rdb.Del(ctx, key(n), key(n)+":rl", key(n)+":rc").Err())
}
