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
	r := e.client(e.rdb()).ReentrantMutex(name(t))
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
	outer, inner := c.ReentrantMutex(n), c.ReentrantMutex(n)
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
	r := e.client(e.rdb()).ReentrantMutex(n)
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
	r := e.client(e.rdb()).ReentrantMutex(n)
	other := e.client(e.rdb()).ReentrantMutex(n)
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
				r := c.ReentrantMutex(n)
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
	holder := holderClient.ReentrantMutex(n)
	admin := e.client(e.rdb()).ReentrantMutex(n)
	waiter := e.client(e.rdb()).ReentrantMutex(n)
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
	r := e.client(e.rdb()).ReentrantMutex(name(t), dlock.WithLease(5*time.Second))
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
