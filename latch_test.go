package dlock_test

import (
	"context"
	"fmt"
	"math"
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

func TestCountDownLatch_AwaitersOnThreeClients_ReleasedAtZero(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 30*time.Second)
	admin := e.client(e.rdb()).CountDownLatch(n)
	ok, err := admin.TrySetCount(ctx, 3)
	require.NoError(t, err)
	require.True(t, ok)
	var released atomic.Int32
	var wg sync.WaitGroup
	for range 3 {
		c := e.client(e.rdb())
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if assert.NoError(t, c.CountDownLatch(n).Await(ctx)) {
					released.Add(1)
				}
			}()
		}
	}
	counters := e.client(e.rdb())
	for i := range 3 {
		time.Sleep(100 * time.Millisecond)
		assert.Zero(t, released.Load(), "Await returned with the count at %d", 3-i)
		require.NoError(t, counters.CountDownLatch(n).CountDown(ctx))
	}
	within(t, waitGroupDone(&wg), 2*time.Second, "every Await after the last CountDown")
	assert.EqualValues(t, 6, released.Load())
}

func TestCountDownLatch_AwaitHonoursContext(t *testing.T) {
	e := sharedEnv(t)
	l := e.client(e.rdb()).CountDownLatch(name(t))
	_, err := l.TrySetCount(context.Background(), 1)
	require.NoError(t, err)
	err = l.Await(ctxTimeout(t, 100*time.Millisecond))
	assert.ErrorIs(t, err, dlock.ErrNotObtained)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestCountDownLatch_ZeroIsNoOpAndLatchIsReusable(t *testing.T) {
	e := sharedEnv(t)
	rdb := e.rdb()
	n := name(t)
	l := e.client(rdb).CountDownLatch(n)
	ctx := context.Background()
	require.NoError(t, l.CountDown(ctx), "counting down an unset latch")
	count, err := l.Count(ctx)
	require.NoError(t, err)
	assert.Zero(t, count)
	require.NoError(t, l.Await(ctx), "an unset latch is open")

	ok, err := l.TrySetCount(ctx, 2)
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = l.TrySetCount(ctx, 5)
	require.NoError(t, err)
	assert.False(t, ok, "already counting")
	require.NoError(t, l.CountDown(ctx))
	require.NoError(t, l.CountDown(ctx))
	require.NoError(t, l.CountDown(ctx)) // at zero: nothing
	count, err = l.Count(ctx)
	require.NoError(t, err)
	assert.Zero(t, count)
	ok, err = l.TrySetCount(ctx, 1)
	require.NoError(t, err)
	assert.True(t, ok, "reusable after reaching zero")
	count, err = l.Count(ctx)
	require.NoError(t, err)
	assert.EqualValues(t, 1, count)

	_, err = l.TrySetCount(ctx, -1)
	assert.ErrorIs(t, err, dlock.ErrInvalid)
	_, err = l.TrySetCount(ctx, 0)
	assert.ErrorIs(t, err, dlock.ErrInvalid)
	assert.ErrorIs(t, e.client(rdb).CountDownLatch("").CountDown(ctx), dlock.ErrInvalid)

	wrong := name(t) + "-wrong"
	require.NoError(t, rdb.Set(ctx, key(wrong), "not a latch", 0).Err())
	_, err = l.TrySetCount(ctx, 1)
	require.NoError(t, err)
	_, err = e.client(rdb).CountDownLatch(wrong).TrySetCount(ctx, 1)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "not a lock of this kind")
	assert.Error(t, e.client(rdb).CountDownLatch(wrong).CountDown(ctx))
}

// A count beyond MaxPermits is refused before anything is sent, with an
// error that names the bound; MaxPermits itself is kept exactly.
func TestCountDownLatch_CountBeyondMaxPermits_ErrInvalidNothingSent(t *testing.T) {
	e := sharedEnv(t)
	rdb := e.rdb()
	cnt := newCounter()
	l := e.client(e.rdb(cnt)).CountDownLatch(name(t))
	ctx := ctxTimeout(t, 10*time.Second)
	for _, n := range []int64{dlock.MaxPermits + 1, math.MaxInt64} {
		ok, err := l.TrySetCount(ctx, n)
		assert.ErrorIs(t, err, dlock.ErrInvalid, "count %d", n)
		if assert.Error(t, err) {
			assert.Contains(t, err.Error(), fmt.Sprint(int64(dlock.MaxPermits)), "the error names the bound")
		}
		assert.False(t, ok)
	}
	assert.Zero(t, cnt.total(), "nothing sent")
	exists, err := rdb.Exists(ctx, key(l.Name())).Result()
	require.NoError(t, err)
	assert.Zero(t, exists, "nothing written")

	ok, err := l.TrySetCount(ctx, dlock.MaxPermits)
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, l.CountDown(ctx))
	count, err := l.Count(ctx)
	require.NoError(t, err)
	assert.EqualValues(t, dlock.MaxPermits-1, count, "counts up to MaxPermits are exact")
}

// awaitWaiting starts l.Await and returns once it waits, subscribed and
// past its look after the subscription, with the channel its result comes on.
func awaitWaiting(t *testing.T, ctx context.Context, rdb *redis.Client, l *dlock.CountDownLatch) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- l.Await(ctx) }()
	require.Eventually(t, func() bool {
		subs, err := rdb.PubSubNumSub(ctx, key(l.Name())+":ch").Result()
		return err == nil && subs[key(l.Name())+":ch"] > 0
	}, 5*time.Second, time.Millisecond, "Await subscribed")
	time.Sleep(100 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("Await returned before anything happened: %v", err)
	default:
	}
	return done
}

// A Delete makes every Await return, even when a TrySetCount sets the latch
// counting again before the woken Await looks: here both run in one MULTI,
// so that the Await's look always comes after both.
func TestCountDownLatch_DeleteThenSetBeforeAwaitLooks_AwaitReturns(t *testing.T) {
	e := sharedEnv(t)
	rdb := e.rdb()
	ctx := ctxTimeout(t, 10*time.Second)
	require.NoError(t, scripts.LatchDelete.Load(ctx, rdb).Err())
	require.NoError(t, scripts.LatchSet.Load(ctx, rdb).Err())
	for range 3 {
		n := name(t)
		l := e.client(e.rdb()).CountDownLatch(n)
		ok, err := l.TrySetCount(ctx, 1)
		require.NoError(t, err)
		require.True(t, ok)
		done := awaitWaiting(t, ctxTimeout(t, 3*time.Second), rdb, l)
		_, err = rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.EvalSha(ctx, scripts.LatchDelete.Hash(), []string{key(n), key(n) + ":ch"}, "another-client")
			p.EvalSha(ctx, scripts.LatchSet.Hash(), []string{key(n)}, 1, 0)
			return nil
		})
		require.NoError(t, err)
		count, err := l.Count(ctx)
		require.NoError(t, err)
		require.EqualValues(t, 1, count, "the latch counts again")
		select {
		case err := <-done:
			assert.NoError(t, err, "Await missed a Delete that a quick TrySetCount hid")
		case <-time.After(2 * time.Second):
			t.Fatal("Await missed a Delete that a quick TrySetCount hid")
		}
	}
}

// A latch that expired by its idle expiry is at zero: an Await that next
// looks (at its fallback timer, as nothing is published) returns, even if
// the latch was set counting again meanwhile.
func TestCountDownLatch_IdleExpiredThenSetBeforeAwaitLooks_AwaitReturns(t *testing.T) {
	e := sharedEnv(t)
	rdb := e.rdb()
	const timeout = 600 * time.Millisecond // Await's fallback look
	n := name(t)
	ctx := ctxTimeout(t, 10*time.Second)
	ok, err := e.client(e.rdb()).CountDownLatch(n, dlock.WithIdleExpiry(300*time.Millisecond)).TrySetCount(ctx, 1)
	require.NoError(t, err)
	require.True(t, ok)
	l := e.client(e.rdb(), dlock.WithWatchdogTimeout(timeout)).CountDownLatch(n)
	done := awaitWaiting(t, ctxTimeout(t, 5*time.Second), rdb, l)
	require.Eventually(t, func() bool {
		n, err := rdb.Exists(ctx, key(n)).Result()
		return err == nil && n == 0
	}, 2*time.Second, time.Millisecond, "the latch's idle expiry")
	ok, err = e.client(e.rdb()).CountDownLatch(n).TrySetCount(ctx, 1) // counting again, for good
	require.NoError(t, err)
	require.True(t, ok)
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(3 * timeout):
		t.Fatal("Await missed an idle expiry that a quick TrySetCount hid")
	}
}
