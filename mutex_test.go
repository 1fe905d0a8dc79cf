package dlock_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/scripts"
)

// incrementUnderLock does a deliberately non-atomic read-modify-write of a
// Redis counter, which loses updates unless the lock excludes.
func incrementUnderLock(ctx context.Context, rdb *redis.Client, counterKey string, inside *atomic.Int32, overlaps *atomic.Int32) error {
	if inside.Add(1) != 1 {
		overlaps.Add(1)
	}
	defer inside.Add(-1)
	v, err := rdb.Get(ctx, counterKey).Int()
	if err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	time.Sleep(50 * time.Microsecond) // widen the race window
	return rdb.Set(ctx, counterKey, v+1, time.Minute).Err()
}

func TestMutex_ThreeClientsEightGoroutines_CounterExact(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	const clients, goroutines, rounds = 3, 8, 25
	check := e.rdb()
	var inside, overlaps atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, clients*goroutines)
	for range clients {
		rdb := e.rdb()
		c := e.client(rdb)
		for range goroutines {
			m := c.Mutex(n) // a handle per goroutine
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx := ctxTimeout(t, time.Minute)
				for range rounds {
					if err := m.Lock(ctx); err != nil {
						errs <- err
						return
					}
					err := incrementUnderLock(ctx, rdb, n+":counter", &inside, &overlaps)
					if uerr := m.Unlock(ctx); err == nil {
						err = uerr
					}
					if err != nil {
						errs <- err
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	got, err := check.Get(context.Background(), n+":counter").Int()
	require.NoError(t, err)
	assert.Equal(t, clients*goroutines*rounds, got, "counter under the lock")
	assert.Zero(t, overlaps.Load(), "critical sections overlapped")
	t.Logf("acquisitions checked: %d, overlaps: %d", clients*goroutines*rounds, overlaps.Load())
}

func TestMutex_SharedHandle_ExcludesGoroutinesLikeSyncMutex(t *testing.T) {
	e := sharedEnv(t)
	rdb := e.rdb()
	m := e.client(rdb).Mutex(name(t))
	var inside, overlaps atomic.Int32
	var wg sync.WaitGroup
	const goroutines, rounds = 8, 20
	ctx := ctxTimeout(t, time.Minute)
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				require.NoError(t, m.Lock(ctx))
				require.NoError(t, incrementUnderLock(ctx, rdb, m.Name()+":counter", &inside, &overlaps))
				require.NoError(t, m.Unlock(ctx))
			}
		}()
	}
	wg.Wait()
	got, err := rdb.Get(ctx, m.Name()+":counter").Int()
	require.NoError(t, err)
	assert.Equal(t, goroutines*rounds, got)
	assert.Zero(t, overlaps.Load())
}

func TestMutex_TryLock_HeldElsewhere_ReturnsFalseWithoutError(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	a, b := e.client(e.rdb()).Mutex(n), e.client(e.rdb()).Mutex(n)
	ctx := context.Background()

	ok, err := a.TryLock(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = b.TryLock(ctx)
	require.NoError(t, err)
	assert.False(t, ok, "second TryLock must fail while held")

	require.NoError(t, a.Unlock(ctx))
	ok, err = b.TryLock(ctx)
	require.NoError(t, err)
	assert.True(t, ok, "TryLock after release")
	require.NoError(t, b.Unlock(ctx))
}

func TestMutex_UnlockTwice_ReturnsErrNotHeld(t *testing.T) {
	e := sharedEnv(t)
	m := e.client(e.rdb()).Mutex(name(t))
	ctx := context.Background()
	require.NoError(t, m.Lock(ctx))
	require.NoError(t, m.Unlock(ctx))
	err := m.Unlock(ctx)
	assert.ErrorIs(t, err, dlock.ErrNotHeld)
	assert.NotErrorIs(t, err, dlock.ErrLost)
}

func TestMutex_ExpiredHold_UnlockReturnsErrLostAndSparesNewHolder(t *testing.T) {
	e := realEnv(t) // needs real key expiry
	rdb := e.rdb()
	n := name(t)
	old := e.client(rdb).Mutex(n, dlock.WithLease(100*time.Millisecond))
	newer := e.client(e.rdb()).Mutex(n)
	ctx := ctxTimeout(t, 10*time.Second)

	require.NoError(t, old.Lock(ctx))
	lost := old.Lost()
	within(t, lost, 2*time.Second, "lost signal of the expired lease")
	require.NoError(t, newer.Lock(ctx))
	token := holderOf(t, rdb, n)
	require.NotEmpty(t, token)

	err := old.Unlock(ctx)
	assert.ErrorIs(t, err, dlock.ErrLost)
	assert.ErrorIs(t, err, dlock.ErrNotHeld)
	after := holderOf(t, rdb, n)
	assert.Equal(t, token, after, "the newer holder's token must survive the stale Unlock")
	require.NoError(t, newer.Unlock(ctx))
}

func TestMutex_Uncontended_LockUnlockIsTwoRoundTrips(t *testing.T) {
	e := sharedEnv(t)
	cnt := newCounter()
	m := e.client(e.rdb(cnt)).Mutex(name(t))
	ctx := context.Background()
	require.NoError(t, m.Lock(ctx)) // warm the script cache
	require.NoError(t, m.Unlock(ctx))
	warmedUp(t, cnt)

	cnt.reset()
	const pairs = 50
	for range pairs {
		require.NoError(t, m.Lock(ctx))
		require.NoError(t, m.Unlock(ctx))
	}
	trips, cmds := cnt.snapshot()
	assert.Equal(t, 2*pairs, trips, "round trips for %d Lock+Unlock pairs: %v", pairs, cmds)
	assert.Equal(t, pairs, cmds["evalsha:"+scripts.ExclTry.Hash()], "Lock is one EVALSHA")
	assert.Equal(t, pairs, cmds["evalsha:"+scripts.ExclUnlock.Hash()], "Unlock is one EVALSHA")
	assert.Zero(t, cmds["script"], "no SCRIPT LOAD per call")
}

func TestMutex_LockCancelled_ErrorMatchesBothAndLeavesNothing(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	holder := e.client(e.rdb()).Mutex(n)
	c := e.client(e.rdb())
	ctx := context.Background()
	require.NoError(t, holder.Lock(ctx))

	waiter := c.Mutex(n)
	start := time.Now()
	err := waiter.Lock(ctxTimeout(t, 200*time.Millisecond))
	assert.ErrorIs(t, err, dlock.ErrNotObtained)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), 2*time.Second, "Lock must return when ctx ends")
	assert.ErrorIs(t, waiter.Unlock(ctx), dlock.ErrNotHeld, "a failed Lock holds nothing")

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	err = waiter.Lock(cancelled)
	assert.ErrorIs(t, err, dlock.ErrNotObtained)
	assert.ErrorIs(t, err, context.Canceled)
	require.NoError(t, holder.Unlock(ctx))
}

// Many waiters give up at random moments while the lock changes hands. Every
// Lock that returned an error must have left nothing: at the end the lock is
// free and the successful holders' count is exact.
func TestMutex_RacingCancellations_LeaveNoHoldBehind(t *testing.T) {
	e := sharedEnv(t)
	rdb := e.rdb()
	n := name(t)
	clients := []*dlock.Client{e.client(rdb), e.client(e.rdb())}
	var wg sync.WaitGroup
	var got, failed atomic.Int32
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := clients[i%2].Mutex(n)
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(1+i%7)*time.Millisecond)
			defer cancel()
			if err := m.Lock(ctx); err != nil {
				if !errors.Is(err, dlock.ErrNotObtained) {
					t.Errorf("unexpected error: %v", err)
				}
				failed.Add(1)
				return
			}
			got.Add(1)
			time.Sleep(time.Millisecond)
			assert.NoError(t, m.Unlock(context.Background()))
		}()
	}
	wg.Wait()
	assert.Empty(t, holderOf(t, rdb, n), "lock held after %d holds and %d cancellations", got.Load(), failed.Load())
	assert.Equal(t, int32(40), got.Load()+failed.Load())
}

func TestMutex_Inspection_IsLockedTTLAndForceUnlockWakesTheQueue(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 10*time.Second)
	c := e.client(e.rdb(), dlock.WithWatchdogTimeout(3*time.Second))
	holder, waiter, operator := c.Mutex(n), e.client(e.rdb()).Mutex(n), e.client(e.rdb()).Mutex(n)

	locked, err := operator.IsLocked(ctx)
	require.NoError(t, err)
	assert.False(t, locked)
	ttl, err := operator.TTL(ctx)
	require.NoError(t, err)
	assert.Zero(t, ttl, "free: no lease")

	require.NoError(t, holder.Lock(ctx))
	locked, err = operator.IsLocked(ctx)
	require.NoError(t, err)
	assert.True(t, locked)
	ttl, err = operator.TTL(ctx)
	require.NoError(t, err)
	assert.Greater(t, ttl, time.Second)
	assert.LessOrEqual(t, ttl, 3*time.Second)

	done := queueUp(t, ctx, e.rdb(), n, waiter, 1)
	released, err := operator.ForceUnlock(ctx)
	require.NoError(t, err)
	assert.True(t, released)
	within(t, done, 2*time.Second, "the queued waiter handed the lock")
	within(t, holder.Lost(), 2*time.Second, "the forced-out holder told at its next renewal")
	assert.ErrorIs(t, holder.Unlock(ctx), dlock.ErrLost)
	require.NoError(t, waiter.Unlock(ctx))
	released, err = operator.ForceUnlock(ctx)
	require.NoError(t, err)
	assert.False(t, released, "nothing held")
}
