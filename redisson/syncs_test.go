package redisson_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock"
)

func TestSemaphore_GoAndJava_NeverExceedThePermits(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ctx := ctxT(t, 30*time.Second)
	s := e.go_.Semaphore("pool")
	ok, err := s.TrySetPermits(ctx, 2)
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = e.java.TrySetPermits(ctx, "pool", 5)
	require.NoError(t, err)
	assert.False(t, ok, "already set")
	var inside, most atomic.Int32
	use := func() {
		n := inside.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(3 * time.Millisecond)
		inside.Add(-1)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	for range 3 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for range 8 {
				if err := s.Acquire(ctx, 1); err != nil {
					errs <- err
					return
				}
				use()
				if err := s.Release(ctx, 1); err != nil {
					errs <- err
					return
				}
			}
		}()
		go func() {
			defer wg.Done()
			for range 8 {
				if err := e.java.Acquire(ctx, "pool", 1); err != nil {
					errs <- err
					return
				}
				use()
				if err := e.java.Release(ctx, "pool", 1); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	assert.LessOrEqual(t, most.Load(), int32(2), "more users than permits")
	assert.Equal(t, int32(2), most.Load(), "the two permits were never used together")
	n, err := s.AvailablePermits(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(2), n)
}

func TestSemaphore_GoRelease_WakesJavaAcquirer_AndBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ctx := ctxT(t, 20*time.Second)
	s := e.go_.Semaphore("pool")
	_, err := s.TrySetPermits(ctx, 0)
	require.NoError(t, err)
	// Java's acquire has no timed fallback: only the message wakes it.
	j := result(func() error { return e.java.Acquire(ctx, "pool", 2) })
	awaitSubscribers(t, e.rdb, "redisson_sc:{pool}", 1)
	require.NoError(t, s.Release(ctx, 1))
	notYet(t, j, 100*time.Millisecond)
	require.NoError(t, s.Release(ctx, 1))
	require.NoError(t, recv(t, j, 3*time.Second).err)

	g := result(func() error { return s.Acquire(ctx, 1) })
	awaitSubscribers(t, e.rdb, "redisson_sc:{pool}", 1)
	notYet(t, g, 100*time.Millisecond)
	require.NoError(t, e.java.Release(ctx, "pool", 1))
	r := recv(t, g, 3*time.Second)
	require.NoError(t, r.err)
	assert.Less(t, r.took, 3*time.Second)
	n, err := e.java.AvailablePermits(ctx, "pool")
	require.NoError(t, err)
	assert.Zero(t, n)
}

func TestSemaphore_BadInput_And_ForeignKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ctx := ctxT(t, 10*time.Second)
	s := e.go_.Semaphore("pool")
	_, err := s.TryAcquire(ctx, 0)
	assert.ErrorIs(t, err, dlock.ErrInvalid)
	assert.ErrorIs(t, s.Release(ctx, -1), dlock.ErrInvalid)
	_, err = s.TrySetPermits(ctx, -1)
	assert.ErrorIs(t, err, dlock.ErrInvalid)
	require.NoError(t, e.rdb.Set(ctx, "text", "hello", 0).Err())
	require.NoError(t, e.rdb.HSet(ctx, "hash", "a", "1").Err())
	for _, name := range []string{"text", "hash"} {
		_, err := e.go_.Semaphore(name).TryAcquire(ctx, 1)
		assert.ErrorIs(t, err, dlock.ErrInvalid, name)
		assert.ErrorIs(t, e.go_.Semaphore(name).Release(ctx, 1), dlock.ErrInvalid, name)
		assert.ErrorIs(t, e.go_.CountDownLatch(name).CountDown(ctx), dlock.ErrInvalid, name)
	}
	_, err = e.go_.Semaphore("hash").TrySetPermits(ctx, 1)
	assert.ErrorIs(t, err, dlock.ErrInvalid)
	_, err = e.go_.CountDownLatch("hash").TrySetCount(ctx, 1)
	assert.ErrorIs(t, err, dlock.ErrInvalid)
	err = e.go_.CountDownLatch("hash").Await(ctx)
	assert.ErrorIs(t, err, dlock.ErrInvalid)
	h, err := e.rdb.HGetAll(ctx, "hash").Result()
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"a": "1"}, h)
	v, err := e.rdb.Get(ctx, "text").Result()
	require.NoError(t, err)
	assert.Equal(t, "hello", v)
}

func TestCountDownLatch_GoCountDown_WakesJavaAwaiters_AndBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ctx := ctxT(t, 20*time.Second)
	l := e.go_.CountDownLatch("start")
	ok, err := l.TrySetCount(ctx, 2)
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = e.java.TrySetCount(ctx, "start", 5)
	require.NoError(t, err)
	assert.False(t, ok)
	j1 := result(func() error { return e.java.Await(ctx, "start") })
	j2 := result(func() error { return e.java.Await(ctx, "start") })
	awaitSubscribers(t, e.rdb, "redisson_countdownlatch__channel__{start}", 2)
	require.NoError(t, e.java.CountDown(ctx, "start"))
	require.NoError(t, l.CountDown(ctx))
	for _, r := range []timed{recv(t, j1, 3*time.Second), recv(t, j2, 3*time.Second)} {
		require.NoError(t, r.err)
	}
	n, err := l.Count(ctx)
	require.NoError(t, err)
	assert.Zero(t, n)

	ok, err = e.java.TrySetCount(ctx, "start", 1)
	require.NoError(t, err)
	require.True(t, ok, "a latch that reached zero can be set again")
	g := result(func() error { return l.Await(ctx) })
	awaitSubscribers(t, e.rdb, "redisson_countdownlatch__channel__{start}", 1)
	notYet(t, g, 100*time.Millisecond)
	require.NoError(t, e.java.CountDown(ctx, "start"))
	r := recv(t, g, 3*time.Second)
	require.NoError(t, r.err)
	assert.Less(t, r.took, 3*time.Second)
	require.NoError(t, l.Await(ctx), "a missing latch is open")
}
