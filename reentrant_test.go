package dlock_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock"
)

func TestReentrantMutex_NestedLocks_CountHolds(t *testing.T) {
	e := sharedEnv(t)
	r := e.client(e.rdb()).ReentrantMutex(name(t), dlock.WithHandleOwner())
	ctx := context.Background()
	for want := 1; want <= 3; want++ {
		require.NoError(t, r.Lock(ctx))
		got, err := r.HoldCount(ctx)
		require.NoError(t, err)
		assert.Equal(t, want, got)
	}
	for want := 2; want >= 0; want-- {
		require.NoError(t, r.Unlock(ctx))
		got, err := r.HoldCount(ctx)
		require.NoError(t, err)
		assert.Equal(t, want, got)
	}
	locked, err := r.IsLocked(ctx)
	require.NoError(t, err)
	assert.False(t, locked, "the last Unlock releases the lock")
	assert.ErrorIs(t, r.Unlock(ctx), dlock.ErrNotHeld)
}

func TestReentrantMutex_OwnerInContext_ReentersThroughAnotherHandle(t *testing.T) {
	e := sharedEnv(t)
	c := e.client(e.rdb())
	n := name(t)
	outer, inner := c.ReentrantMutex(n, dlock.WithHandleOwner()), c.ReentrantMutex(n, dlock.WithHandleOwner())
	ctx := dlock.WithOwner(context.Background(), "request-42")

	require.NoError(t, outer.Lock(ctx))
	ok, err := inner.TryLock(ctx)
	require.NoError(t, err)
	require.True(t, ok, "same owner, other handle: re-entry")
	count, err := outer.HoldCount(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, count)

	// Without the owner in the context, a handle is its own owner.
	ok, err = inner.TryLock(context.Background())
	require.NoError(t, err)
	assert.False(t, ok, "the handle as owner is someone else")

	require.NoError(t, inner.Unlock(ctx))
	require.NoError(t, outer.Unlock(ctx))
	locked, err := outer.IsLocked(ctx)
	require.NoError(t, err)
	assert.False(t, locked)
}

func TestReentrantMutex_SecondOwner_BlocksUntilRelease(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	r := e.client(e.rdb()).ReentrantMutex(n, dlock.WithHandleOwner())
	first := dlock.WithOwner(context.Background(), "first")
	second, cancel := context.WithTimeout(dlock.WithOwner(context.Background(), "second"), 10*time.Second)
	defer cancel()

	require.NoError(t, r.Lock(first))
	require.NoError(t, r.Lock(first))
	acquired := make(chan struct{})
	go func() {
		defer close(acquired)
		assert.NoError(t, r.Lock(second))
	}()
	select {
	case <-acquired:
		t.Fatal("second owner acquired while the first held the lock")
	case <-time.After(200 * time.Millisecond):
	}
	require.NoError(t, r.Unlock(first))
	select {
	case <-acquired:
		t.Fatal("second owner acquired while the first still held one hold")
	case <-time.After(100 * time.Millisecond):
	}
	require.NoError(t, r.Unlock(first))
	within(t, acquired, 2*time.Second, "second owner's Lock after release")
	count, err := r.HoldCount(second)
	require.NoError(t, err)
	assert.Equal(t, 1, count)
	require.NoError(t, r.Unlock(second))
}

func TestReentrantMutex_UnlockByOtherOwner_ReturnsErrNotHeld(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	r := e.client(e.rdb()).ReentrantMutex(n, dlock.WithHandleOwner())
	other := e.client(e.rdb()).ReentrantMutex(n, dlock.WithHandleOwner())
	owner := dlock.WithOwner(context.Background(), "owner")
	require.NoError(t, r.Lock(owner))

	// Same owner string on another Client is another owner.
	assert.ErrorIs(t, other.Unlock(owner), dlock.ErrNotHeld)
	assert.ErrorIs(t, r.Unlock(dlock.WithOwner(context.Background(), "intruder")), dlock.ErrNotHeld)
	count, err := r.HoldCount(owner)
	require.NoError(t, err)
	assert.Equal(t, 1, count, "a failed Unlock changes nothing")
	require.NoError(t, r.Unlock(owner))
}

func TestReentrantMutex_ManyOwners_CounterExact(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	rdb := e.rdb()
	var inside, overlaps atomic.Int32
	var wg sync.WaitGroup
	const clients, owners, rounds = 3, 6, 15
	for range clients {
		c := e.client(e.rdb())
		for range owners {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := c.ReentrantMutex(n, dlock.WithHandleOwner())
				ctx := dlock.WithNewOwner(ctxTimeout(t, time.Minute))
				for range rounds {
					require.NoError(t, r.Lock(ctx))
					require.NoError(t, r.Lock(ctx)) // nested
					require.NoError(t, incrementUnderLock(ctx, rdb, n+":counter", &inside, &overlaps))
					require.NoError(t, r.Unlock(ctx))
					require.NoError(t, r.Unlock(ctx))
				}
			}()
		}
	}
	wg.Wait()
	got, err := rdb.Get(context.Background(), n+":counter").Int()
	require.NoError(t, err)
	assert.Equal(t, clients*owners*rounds, got)
	assert.Zero(t, overlaps.Load())
}

func TestReentrantMutex_ForceUnlock_WakesWaiterAndSignalsHolder(t *testing.T) {
	e := realEnv(t)
	n := name(t)
	holderClient := e.client(e.rdb(), dlock.WithWatchdogTimeout(900*time.Millisecond))
	holder := holderClient.ReentrantMutex(n, dlock.WithHandleOwner())
	admin := e.client(e.rdb()).ReentrantMutex(n, dlock.WithHandleOwner())
	waiter := e.client(e.rdb()).ReentrantMutex(n, dlock.WithHandleOwner())
	ctx := ctxTimeout(t, 10*time.Second)

	require.NoError(t, holder.Lock(ctx))
	hctx, stop := holder.HoldContext(ctx)
	defer stop()
	got := make(chan struct{})
	go func() {
		defer close(got)
		assert.NoError(t, waiter.Lock(ctx))
	}()
	time.Sleep(100 * time.Millisecond)

	ok, err := admin.ForceUnlock(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	within(t, got, 2*time.Second, "waiter acquiring after ForceUnlock")
	// The holder is on another Client: it learns at its next renewal
	// (every 300ms here).
	d := within(t, holder.Lost(ctx), 2*time.Second, "holder's lost signal")
	t.Logf("lost signal after ForceUnlock from another Client: %v (renewal period 300ms)", d)
	<-hctx.Done()
	assert.ErrorIs(t, context.Cause(hctx), dlock.ErrLost)
	err = holder.Unlock(ctx)
	assert.ErrorIs(t, err, dlock.ErrLost)
	assert.ErrorIs(t, err, dlock.ErrNotHeld)

	ok, err = admin.ForceUnlock(ctx)
	require.NoError(t, err)
	assert.True(t, ok, "the waiter's hold")
	ok, err = admin.ForceUnlock(ctx)
	require.NoError(t, err)
	assert.False(t, ok, "nothing left to force")
}

func TestReentrantMutex_TTL_ReportsLeaseAndZeroWhenFree(t *testing.T) {
	e := sharedEnv(t)
	r := e.client(e.rdb()).ReentrantMutex(name(t), dlock.WithLease(5*time.Second), dlock.WithHandleOwner())
	ctx := context.Background()
	d, err := r.TTL(ctx)
	require.NoError(t, err)
	assert.Zero(t, d)
	require.NoError(t, r.Lock(ctx))
	d, err = r.TTL(ctx)
	require.NoError(t, err)
	assert.Greater(t, d, 4*time.Second)
	assert.LessOrEqual(t, d, 5*time.Second)
	require.NoError(t, r.Unlock(ctx))
}

// A handle shared like a sync.Mutex field, by goroutines with no owner in
// their contexts, must not let them both hold the lock: without
// WithHandleOwner such calls fail at once and write nothing; with an owner
// per goroutine they exclude each other; WithHandleOwner opts in to the
// handle being the one owner.
func TestReentrantMutex_SharedHandleWithoutOwner_NeverTwoHolders(t *testing.T) {
	e := sharedEnv(t)
	c := e.client(e.rdb())
	ctx := ctxTimeout(t, 20*time.Second)
	probe := e.rdb()

	shared := c.ReentrantMutex(name(t))
	for _, call := range []func() error{
		func() error { return shared.Lock(ctx) },
		func() error { _, err := shared.TryLock(ctx); return err },
		func() error { return c.RWMutex(shared.Name()).Lock(ctx) },
		func() error { return c.RWMutex(shared.Name()).RLock(ctx) },
	} {
		err := call()
		assert.ErrorIs(t, err, dlock.ErrInvalid)
		assert.Contains(t, err.Error(), "WithOwner")
	}
	n, err := probe.Exists(ctx, key(shared.Name()), key(shared.Name())+":mq").Result()
	require.NoError(t, err)
	assert.Zero(t, n, "a refused call wrote")

	// An owner per goroutine on the shared handle: exact counter.
	var counter, inside atomic.Int32
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			octx := dlock.WithNewOwner(ctx)
			for range 10 {
				if !assert.NoError(t, shared.Lock(octx)) {
					return
				}
				assert.EqualValues(t, 1, inside.Add(1), "two goroutines held the lock")
				counter.Add(1)
				inside.Add(-1)
				assert.NoError(t, shared.Unlock(octx))
			}
		}()
	}
	wg.Wait()
	assert.EqualValues(t, 40, counter.Load())

	// WithHandleOwner: the handle is the owner, so its users share one hold.
	own := c.ReentrantMutex(name(t), dlock.WithHandleOwner())
	require.NoError(t, own.Lock(ctx))
	require.NoError(t, own.Lock(ctx))
	count, err := own.HoldCount(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, count)
	require.NoError(t, own.Unlock(ctx))
	require.NoError(t, own.Unlock(ctx))
}

// Another Client's ForceUnlock takes an owner's hold away and hands the
// lock to the next owner, queued on the same Client: that Client, which
// is subscribed for its waiter, tells the first owner of its loss before
// the next one holds, instead of at the first owner's next renewal.
func TestReentrantMutex_ForceUnlockElsewhere_LosingOwnerToldBeforeTheNextHolds(t *testing.T) {
	e := realEnv(t)
	n := name(t)
	c := e.client(e.rdb())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	o1, o2 := dlock.WithOwner(ctx, "one"), dlock.WithOwner(ctx, "two")
	r := c.ReentrantMutex(n)
	require.NoError(t, r.Lock(o1))
	require.NoError(t, r.Lock(o1))
	lost := r.Lost(o1)
	// Subscribed first, so that the waiter does not look again in Redis on
	// the confirmation, and claim the hand-over by a try of its own.
	require.Eventually(t, func() bool { return dlock.ChannelConfirmed(c, c.Mutex(n)) }, 5*time.Second, time.Millisecond)
	second := make(chan bool, 1)
	go func() {
		err := r.Lock(o2)
		assert.NoError(t, err)
		select {
		case <-lost:
			second <- true
		default:
			second <- false
		}
	}()
	waitQueued(t, e, n, 1)

	released, err := e.client(e.rdb()).ReentrantMutex(n).ForceUnlock(ctx)
	require.NoError(t, err)
	require.True(t, released)
	within(t, lost, time.Second, "the first owner's loss")
	select {
	case told := <-second:
		assert.True(t, told, "the next owner held before the first was told of its loss")
	case <-time.After(5 * time.Second):
		t.Fatal("the next owner was not handed the lock")
	}
	assert.ErrorIs(t, r.Unlock(o1), dlock.ErrLost)
	require.NoError(t, r.Unlock(o2))
}
