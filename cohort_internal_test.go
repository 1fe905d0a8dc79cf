package dlock

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock/internal/engine"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/wait"
)

// requireFreeWithEmptyQueue checks that the lock called n is free and that
// its queue in Redis holds nobody: a place left there would be handed the
// lock by the next release, with no one to claim it.
func requireFreeWithEmptyQueue(t *testing.T, c *Client, m *Mutex) {
	t.Helper()
	ctx := context.Background()
	locked, err := m.IsLocked(ctx)
	require.NoError(t, err)
	require.False(t, locked, "the lock is held after its last Unlock (handed to a place nobody claims)")
	queued, err := c.core.RDB.ZRange(ctx, m.h.Keys[1], 0, -1).Result()
	require.NoError(t, err)
	require.Empty(t, queued, "places left in the queue in Redis")
	other := New(c.core.RDB)
	defer other.Close()
	ok, err := other.Mutex(m.h.Name).TryLock(ctx)
	require.NoError(t, err)
	require.True(t, ok, "another Client cannot take the free lock")
}

// cohortClient starts a Redis server and a Client on it, closed at the
// test's end, and a context for the test's calls.
func cohortClient(t *testing.T) (*Client, context.Context) {
	t.Helper()
	srv := redistest.Start(t)
	c := New(srv.NewClient(t))
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c, ctx
}

// servedWithin fails the test unless done yields nil within d: what the
// waiter that sends to done was served by.
func servedWithin(t *testing.T, done <-chan error, d time.Duration, what string) {
	t.Helper()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(d):
		t.Fatalf("the waiter was not served within %v %s", d, what)
	}
}

// subscribed makes c subscribe to m's channel now and keep it for the test,
// so that a waiter's first wake-up is not the subscription's confirmation,
// which makes it look again in Redis.
func subscribed(t *testing.T, c *Client, m *Mutex) {
	t.Helper()
	_, err := c.core.Hub().Acquire(context.Background(), m.h.Channel)
	require.NoError(t, err)
	t.Cleanup(func() { c.core.Hub().Release(m.h.Channel) })
	require.Eventually(t, func() bool { return ChannelConfirmed(c, m) }, 5*time.Second, time.Millisecond)
}

// A goroutine waiting for a local handoff whose local timer fires just as
// the cohort hands it the hold (both ready in one select, as when the
// goroutine is scheduled late) must take the hold, not also try in Redis:
// the try would queue a place that the cohort's last Unlock then hands the
// lock to, and the lock would sit idle until that place's mark ran out.
//
// The waiter's local timer runs for its handle's time bound (20ms); the
// hold reaches it through a handle with a longer bound (1s), after the
// timer fired, while a hook holds the waiter before it looks again.
func TestMutexCohort_LocalTimerRacesHandoff_LeavesNoPlaceInRedis(t *testing.T) {
	c, ctx := cohortClient(t)
	short := c.Mutex(t.Name(), WithCohort(4, 20*time.Millisecond))
	long := c.Mutex(t.Name(), WithCohort(4, time.Second))
	subscribed(t, c, short)
	handed := make(chan struct{})
	var once sync.Once
	c.core.Loop.BeforeRetry = func(w *wait.Waiter) {
		if w.Cohort() == wait.Cohort(short.lk.(*engine.Mutex)) {
			once.Do(func() { <-handed })
		}
	}
	require.NoError(t, short.Lock(ctx))

	longDone := make(chan error, 1)
	go func() { longDone <- long.Lock(ctx) }() // queues in Redis: long holds nothing
	// It queues in Redis on its first try and joins the registry after the
	// reply; it must be first in the registry too.
	require.Eventually(t, func() bool { return c.core.Waits.Len() == 1 }, 5*time.Second, time.Millisecond)
	shortDone := make(chan error, 1)
	go func() { shortDone <- short.Lock(ctx) }() // waits locally: short holds
	require.Eventually(t, func() bool { return c.core.Waits.Len() == 2 }, 5*time.Second, time.Millisecond)
	require.NoError(t, short.Unlock(ctx)) // hands the hold to long's waiter, first in line
	require.NoError(t, <-longDone)
	time.Sleep(40 * time.Millisecond)    // short's waiter's timer has fired; the hook holds it
	require.NoError(t, long.Unlock(ctx)) // hands the hold to short's waiter, within long's bound
	close(handed)
	require.NoError(t, <-shortDone)
	require.NotZero(t, short.Token())
	require.NoError(t, short.Unlock(ctx))
	requireFreeWithEmptyQueue(t, c, short)
}

// A local waiter whose ctx ends after the cohort's release took it from the
// registry, and before the release's script queued it in Redis, cancels
// before it is queued: the release must take its place out again, or the
// lock is handed to it and sits idle until its mark runs out.
func TestMutexCohort_WaiterCancelledWhileReleaseQueuesIt_LeavesNoPlaceInRedis(t *testing.T) {
	srv := redistest.Start(t)
	c := New(srv.NewClient(t))
	defer c.Close()
	m := c.Mutex(t.Name(), WithCohort(4, 20*time.Millisecond))
	subscribed(t, c, m)
	require.NoError(t, m.Lock(context.Background()))
	time.Sleep(30 * time.Millisecond) // past the cohort's time bound: Unlock releases to Redis

	wctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Lock(wctx) }() // waits locally: the cohort runs
	time.Sleep(5 * time.Millisecond)
	var once sync.Once
	c.core.Hooks.BeforeCohortRelease = func() {
		once.Do(func() {
			cancel()
			require.ErrorIs(t, <-done, ErrNotObtained) // it left, and cancelled its (absent) place
		})
	}
	require.NoError(t, m.Unlock(context.Background()))
	requireFreeWithEmptyQueue(t, c, m)
}

// A goroutine waiting for a local handoff of a cohort hold that is lost
// tries in Redis at once, not at its handle's time bound (a minute here):
// nothing will hand it that hold. The holder learns of its loss first.
func TestMutexCohort_HoldLost_LocalWaiterTriesAtOnce(t *testing.T) {
	c, ctx := cohortClient(t)
	m := c.Mutex(t.Name(), WithCohort(4, time.Minute))
	subscribed(t, c, m)
	require.NoError(t, m.Lock(ctx))
	lost := m.Lost()
	done := make(chan error, 1)
	go func() { done <- m.Lock(ctx) }() // waits locally: the cohort runs
	require.Eventually(t, func() bool { return c.core.Waits.Len() == 1 }, 5*time.Second, time.Millisecond)

	// The hold is lost, and its Client learns of it at once: its own
	// ForceUnlock reports it so (a renewal that finds it gone does the
	// same, a renewal period later).
	released, err := m.ForceUnlock(ctx)
	require.NoError(t, err)
	require.True(t, released)
	servedWithin(t, done, 2*time.Second, "after the cohort's hold was lost (it waited for its time bound)")
	select {
	case <-lost:
	default:
		t.Fatal("the waiter holds, and the lost holder was not told")
	}
	require.NoError(t, m.Unlock(ctx))
	requireFreeWithEmptyQueue(t, c, m)
}

// A Lock that found a cohort running, and joins the registry to wait for a
// local handoff only after the cohort's last Unlock released the lock in
// Redis (which queued the local waiters it found), tries at once, not at
// its handle's time bound (a minute here).
func TestMutexCohort_CohortEndsBeforeTheLocalWaiterJoins_ItTriesAtOnce(t *testing.T) {
	c, ctx := cohortClient(t)
	m := c.Mutex(t.Name(), WithCohort(4, time.Minute))
	subscribed(t, c, m)
	require.NoError(t, m.Lock(ctx))
	paused, resume := make(chan struct{}), make(chan struct{})
	var once sync.Once
	c.core.Hooks.BeforeLocalWait = func() {
		once.Do(func() {
			close(paused)
			<-resume
		})
	}
	done := make(chan error, 1)
	go func() { done <- m.Lock(ctx) }() // finds the cohort running
	<-paused
	require.NoError(t, m.Unlock(ctx)) // nobody in the registry yet: released in Redis
	close(resume)
	servedWithin(t, done, 2*time.Second, "after the cohort ended (it waited for its time bound)")
	require.NoError(t, m.Unlock(ctx))
	requireFreeWithEmptyQueue(t, c, m)
}

// Found by review: a local handoff to a goroutine waiting on a handle whose
// slot still held a cohort hold lost without the Client knowing (its key
// deleted) ends that older hold as it puts the new one in, under the wait
// registry's lock; the report of that loss must not take the registry's
// lock on the same goroutine (it did, and the Unlock hung for good, the
// whole Client with it).
func TestMutexCohort_LocalHandoffReplacesAHoldLostUnnoticed_NoDeadlock(t *testing.T) {
	c, ctx := cohortClient(t)
	wm := c.Mutex(t.Name(), WithCohort(4, time.Minute))
	m := c.Mutex(t.Name(), WithCohort(4, time.Minute))
	subscribed(t, c, m)
	require.NoError(t, wm.Lock(ctx))
	lost := wm.Lost()
	require.NoError(t, c.core.RDB.Del(ctx, wm.h.Key).Err()) // lost; the Client learns at its next renewal
	require.NoError(t, m.Lock(ctx))                         // granted in Redis
	done := make(chan error, 1)
	go func() { done <- wm.Lock(ctx) }() // waits locally: wm's slot still shows its hold live
	require.Eventually(t, func() bool { return c.core.Waits.Len() == 1 }, 5*time.Second, time.Millisecond)
	unlocked := make(chan error, 1)
	go func() { unlocked <- m.Unlock(ctx) }() // hands m's hold to wm's waiter
	select {
	case err := <-unlocked:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("the Unlock that hands the hold on hung") // (and Close after it)
	}
	servedWithin(t, done, 5*time.Second, "by the local handoff")
	within := time.After(time.Second)
	select {
	case <-lost:
	case <-within:
		t.Fatal("the replaced hold was not reported lost")
	}
	require.NoError(t, wm.Unlock(ctx))
	requireFreeWithEmptyQueue(t, c, wm)
}

// Found by review: a ForceUnlock's notice that arrives while an Unlock
// hands the hold on locally (the hold out of its slot, the cohort's record
// not yet moved to the next) found no hold to report lost, and the forced
// hold went on locally while another Client could take the lock. The Core
// now marks the forced grant, and a local handoff looks for the mark.
func TestMutexCohort_ForceNoticeDuringALocalHandoff_NothingHandedOn(t *testing.T) {
	c, ctx := cohortClient(t)
	other := New(c.core.RDB)
	defer other.Close()
	m := c.Mutex(t.Name(), WithCohort(4, time.Minute))
	subscribed(t, c, m)
	require.NoError(t, m.Lock(ctx))
	first := m.Token()
	done := make(chan error, 1)
	go func() { done <- m.Lock(ctx) }() // waits locally, and records the cohort
	require.Eventually(t, func() bool { return c.core.Waits.CohortAt(m.h.Channel, m.h.Key) != nil }, 5*time.Second, time.Millisecond)
	noticed := make(chan struct{})
	var once, noticeOnce sync.Once
	c.core.Hooks.AfterForcedNotice = func() { noticeOnce.Do(func() { close(noticed) }) }
	c.core.Hooks.BeforePassLocal = func() {
		once.Do(func() {
			ok, err := other.Mutex(t.Name()).ForceUnlock(ctx)
			require.NoError(t, err)
			require.True(t, ok)
			<-noticed
		})
	}
	require.ErrorIs(t, m.Unlock(ctx), ErrLost, "the holder's Unlock after the force")
	require.NoError(t, <-done)
	assert.Greater(t, m.Token(), first+uint64(DefaultCohortHandoffs), "the forced hold was handed on locally")
	ok, err := other.Mutex(t.Name()).TryLock(ctx)
	require.NoError(t, err)
	require.False(t, ok, "another Client took the lock its waiter holds")
	require.NoError(t, m.Unlock(ctx))
}
