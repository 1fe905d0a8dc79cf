package redisson_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/redisson"
)

const lockCh = "redisson_lock__channel:{orders}"

func TestLock_GoAndJavaUnderContention_ExcludeEachOther(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ctx := ctxT(t, 30*time.Second)
	const workers, rounds = 4, 12
	var inside atomic.Int32
	var overlap atomic.Bool
	// The counter lives in Redis and is bumped by GET then SET in two round
	// trips: any overlap of two holders loses an increment.
	critical := func() error {
		if inside.Add(1) != 1 {
			overlap.Store(true)
		}
		defer inside.Add(-1)
		n, err := e.rdb.Get(ctx, "counter").Int()
		if err != nil && err != redis.Nil {
			return err
		}
		time.Sleep(time.Millisecond)
		return e.rdb.Set(ctx, "counter", n+1, 0).Err()
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2*workers)
	for w := range workers {
		wg.Add(2)
		go func() { // a Go owner
			defer wg.Done()
			l := e.go_.Lock("orders")
			octx := owner(ctx, "go-"+string(rune('a'+w)))
			for range rounds {
				if err := l.Lock(octx); err != nil {
					errs <- err
					return
				}
				if err := critical(); err != nil {
					errs <- err
				}
				if err := l.Unlock(octx); err != nil {
					errs <- err
					return
				}
			}
		}()
		go func() { // a Java thread
			defer wg.Done()
			tid := int64(100 + w)
			for range rounds {
				if err := e.java.Lock(ctx, "orders", tid, 0); err != nil {
					errs <- err
					return
				}
				if err := critical(); err != nil {
					errs <- err
				}
				if err := e.java.Unlock(ctx, "orders", tid); err != nil {
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
	n, err := e.rdb.Get(ctx, "counter").Int()
	require.NoError(t, err)
	assert.Equal(t, 2*workers*rounds, n, "increments under the lock")
	assert.False(t, overlap.Load(), "two holders at once")
	locked, err := e.go_.Lock("orders").IsLocked(ctx)
	require.NoError(t, err)
	assert.False(t, locked)
}

func TestLock_GoReentry_IsSeenByJava(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ctx := owner(ctxT(t, 10*time.Second), "job-1")
	l := e.go_.Lock("orders")
	require.NoError(t, l.Lock(ctx))
	ok, err := l.TryLock(ctx)
	require.NoError(t, err)
	require.True(t, ok, "re-entry")

	h, err := e.rdb.HGetAll(ctx, "orders").Result()
	require.NoError(t, err)
	require.Len(t, h, 1, "an RLock hash has exactly one field")
	for f, v := range h {
		fieldOK(t, f, e.go_.ID())
		assert.Equal(t, "2", v, "re-entry count")
	}
	n, err := l.HoldCount(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	ttl, err := l.TTL(ctx)
	require.NoError(t, err)
	assert.InDelta(t, 30*time.Second, ttl, float64(2*time.Second), "the watchdog lease")

	for i, wantFree := range []bool{false, true} {
		ok, err := e.java.TryLock(ctx, "orders", 7, 0)
		require.NoError(t, err)
		require.False(t, ok, "Java took a lock Go holds (%d holds left)", 2-i)
		require.NoError(t, l.Unlock(ctx))
		locked, err := e.java.IsLocked(ctx, "orders")
		require.NoError(t, err)
		assert.Equal(t, !wantFree, locked)
	}
	ok, err = e.java.TryLock(ctx, "orders", 7, 0)
	require.NoError(t, err)
	assert.True(t, ok, "Java takes the lock once Go's last hold is undone")
	require.NoError(t, e.java.Unlock(ctx, "orders", 7))
}

func TestLock_JavaReentry_IsSeenByGo(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ctx := ctxT(t, 10*time.Second)
	require.NoError(t, e.java.Lock(ctx, "orders", 7, 0))
	require.NoError(t, e.java.Lock(ctx, "orders", 7, 0))
	n, err := e.java.HoldCount(ctx, "orders", 7)
	require.NoError(t, err)
	require.Equal(t, 2, n)

	l := e.go_.Lock("orders")
	g := owner(ctx, "job-1")
	for range 2 {
		ok, err := l.TryLock(g)
		require.NoError(t, err)
		require.False(t, ok, "Go took a lock Java holds")
		n, err := l.HoldCount(g)
		require.NoError(t, err)
		require.Zero(t, n, "Go's owner holds nothing")
		require.NoError(t, e.java.Unlock(ctx, "orders", 7))
	}
	ok, err := l.TryLock(g)
	require.NoError(t, err)
	assert.True(t, ok)
	assert.ErrorIs(t, e.java.Unlock(ctx, "orders", 7), javapeerIMSE, "Java unlocking Go's hold")
	require.NoError(t, l.Unlock(g))
}

func TestLock_OwnersExcludeEachOther_SameOwnerReenters(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ctx := ctxT(t, 10*time.Second)
	a, b := owner(ctx, "a"), owner(ctx, "b")
	l := e.go_.Lock("orders")
	require.NoError(t, l.Lock(a))
	ok, err := e.go_.Lock("orders").TryLock(b)
	require.NoError(t, err)
	assert.False(t, ok, "another owner")
	assert.ErrorIs(t, l.Unlock(b), dlock.ErrNotHeld)
	ok, err = e.go_.Lock("orders").TryLock(a)
	require.NoError(t, err)
	assert.True(t, ok, "the same owner through another handle")
	require.NoError(t, l.Unlock(a))
	require.NoError(t, l.Unlock(a))
	assert.ErrorIs(t, l.Unlock(a), dlock.ErrNotHeld)
}

func TestLock_GoUnlock_WakesJavaWaiterByMessage(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ctx := ctxT(t, 20*time.Second)
	g := owner(ctx, "job-1")
	l := e.go_.Lock("orders").WithLease(15 * time.Second)
	require.NoError(t, l.Lock(g))
	ch := result(func() error { return e.java.Lock(ctx, "orders", 7, 0) })
	awaitSubscribers(t, e.rdb, lockCh, 1)
	notYet(t, ch, 100*time.Millisecond)
	require.NoError(t, l.Unlock(g))
	r := recv(t, ch, 3*time.Second)
	require.NoError(t, r.err)
	// The lease had 15 s left: only the message can have woken it.
	assert.Less(t, r.took, 3*time.Second)
	held, err := e.java.HoldCount(ctx, "orders", 7)
	require.NoError(t, err)
	assert.Equal(t, 1, held)
}

func TestLock_JavaUnlock_WakesGoWaiterByMessage(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ctx := ctxT(t, 20*time.Second)
	require.NoError(t, e.java.Lock(ctx, "orders", 7, 15*time.Second))
	l := e.go_.Lock("orders")
	g := owner(ctx, "job-1")
	ch := result(func() error { return l.Lock(g) })
	awaitSubscribers(t, e.rdb, lockCh, 1)
	notYet(t, ch, 100*time.Millisecond)
	require.NoError(t, e.java.Unlock(ctx, "orders", 7))
	r := recv(t, ch, 3*time.Second)
	require.NoError(t, r.err)
	assert.Less(t, r.took, 3*time.Second)
	require.NoError(t, l.Unlock(g))
}

func TestLock_GoLeaseExpiry_HonouredByJava_AndReportedLost(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ctx := ctxT(t, 10*time.Second)
	g := owner(ctx, "job-1")
	l := e.go_.Lock("orders").WithLease(400 * time.Millisecond)
	require.NoError(t, l.Lock(g))
	lost := l.Lost(g)
	require.NotNil(t, lost)
	hctx, cancel := l.HoldContext(g)
	defer cancel()
	// Java waits on the TTL it saw; no message comes.
	r := recv(t, result(func() error { return e.java.Lock(ctx, "orders", 7, 0) }), 5*time.Second)
	require.NoError(t, r.err)
	assert.GreaterOrEqual(t, r.took, 250*time.Millisecond, "Java took the lock before Go's lease ran out")
	select {
	case <-lost:
	case <-time.After(2 * time.Second):
		t.Fatal("Lost did not fire when the lease ran out")
	}
	<-hctx.Done()
	assert.ErrorIs(t, context.Cause(hctx), dlock.ErrLost)
	assert.ErrorIs(t, l.Unlock(g), dlock.ErrNotHeld)
	require.NoError(t, e.java.Unlock(ctx, "orders", 7))
}

func TestLock_JavaLeaseExpiry_HonouredByGo(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ctx := ctxT(t, 10*time.Second)
	require.NoError(t, e.java.Lock(ctx, "orders", 7, 400*time.Millisecond))
	l := e.go_.Lock("orders")
	g := owner(ctx, "job-1")
	r := recv(t, result(func() error { return l.Lock(g) }), 5*time.Second)
	require.NoError(t, r.err)
	assert.GreaterOrEqual(t, r.took, 250*time.Millisecond)
	assert.ErrorIs(t, e.java.Unlock(ctx, "orders", 7), javapeerIMSE)
	require.NoError(t, l.Unlock(g))
}

func TestLock_Watchdog_RenewsBothSides(t *testing.T) {
	t.Parallel()
	// A 600 ms watchdog renews every 200 ms; holding for 1.5 s outlives the
	// lease twice over.
	e := newEnv(t, 600*time.Millisecond)
	ctx := ctxT(t, 10*time.Second)
	g := owner(ctx, "job-1")
	l := e.go_.Lock("go-held")
	require.NoError(t, l.Lock(g))
	require.NoError(t, e.java.Lock(ctx, "java-held", 7, 0))
	time.Sleep(1500 * time.Millisecond)

	ok, err := e.java.TryLock(ctx, "go-held", 8, 0)
	require.NoError(t, err)
	assert.False(t, ok, "Go's watchdog hold expired")
	ok, err = e.go_.Lock("java-held").TryLock(owner(ctx, "job-2"))
	require.NoError(t, err)
	assert.False(t, ok, "Java's watchdog hold expired")
	select {
	case <-l.Lost(g):
		t.Fatal("Go's renewed hold reported lost")
	default:
	}
	ttl, err := l.TTL(ctx)
	require.NoError(t, err)
	assert.Greater(t, ttl, 200*time.Millisecond)
	require.NoError(t, l.Unlock(g))
	require.NoError(t, e.java.Unlock(ctx, "java-held", 7))
}

func TestLock_JavaForceUnlock_GoHolderLosesAtRenewal(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 600*time.Millisecond)
	ctx := ctxT(t, 10*time.Second)
	g := owner(ctx, "job-1")
	l := e.go_.Lock("orders")
	require.NoError(t, l.Lock(g))
	waiter := result(func() error { return e.go_.Lock("orders").Lock(owner(ctx, "job-2")) })
	awaitSubscribers(t, e.rdb, lockCh, 1)
	ok, err := e.java.ForceUnlock(ctx, "orders")
	require.NoError(t, err)
	require.True(t, ok)
	r := recv(t, waiter, 3*time.Second)
	require.NoError(t, r.err, "the force unlock's message wakes Go's waiter")
	select {
	case <-l.Lost(g):
	case <-time.After(2 * time.Second):
		t.Fatal("the force-unlocked Go hold was not reported lost")
	}
	err = l.Unlock(g)
	assert.ErrorIs(t, err, dlock.ErrNotHeld)
	require.NoError(t, e.go_.Lock("orders").Unlock(owner(ctx, "job-2")))
}

func TestLock_GoForceUnlock_WakesJavaWaiter(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ctx := ctxT(t, 10*time.Second)
	require.NoError(t, e.java.Lock(ctx, "orders", 7, 0))
	waiter := result(func() error { return e.java.Lock(ctx, "orders", 8, 0) })
	awaitSubscribers(t, e.rdb, lockCh, 1)
	ok, err := e.go_.Lock("orders").ForceUnlock(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	r := recv(t, waiter, 3*time.Second)
	require.NoError(t, r.err)
	assert.ErrorIs(t, e.java.Unlock(ctx, "orders", 7), javapeerIMSE, "the forced holder")
	require.NoError(t, e.java.Unlock(ctx, "orders", 8))
	ok, err = e.go_.Lock("orders").ForceUnlock(ctx)
	require.NoError(t, err)
	assert.False(t, ok, "nothing left to force")
}

func TestLock_Extend_SetsTheLeaseAndStopsRenewal(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ctx := ctxT(t, 10*time.Second)
	g := owner(ctx, "job-1")
	l := e.go_.Lock("orders")
	require.NoError(t, l.Lock(g))
	require.NoError(t, l.Extend(g, 300*time.Millisecond))
	ttl, err := l.TTL(ctx)
	require.NoError(t, err)
	assert.LessOrEqual(t, ttl, 300*time.Millisecond)
	select {
	case <-l.Lost(g):
	case <-time.After(2 * time.Second):
		t.Fatal("the extended lease did not end the hold")
	}
	assert.ErrorIs(t, l.Extend(g, time.Second), dlock.ErrNotHeld)
}

func TestLock_BadInput_IsInvalid(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ctx := owner(ctxT(t, 10*time.Second), "job-1")
	_, err := redisson.New(nil).Lock("x").TryLock(ctx)
	assert.ErrorIs(t, err, dlock.ErrInvalid, "nil client")
	_, err = e.go_.Lock("").TryLock(ctx)
	assert.ErrorIs(t, err, dlock.ErrInvalid, "empty name")
	_, err = e.go_.Lock("x").WithLease(0).TryLock(ctx)
	assert.ErrorIs(t, err, dlock.ErrInvalid, "zero lease")
	_, err = e.go_.Lock("x").WithLease(-time.Second).TryLock(ctx)
	assert.ErrorIs(t, err, dlock.ErrInvalid, "negative lease")
	_, err = e.go_.Lock("x").TryLock(context.Background())
	assert.ErrorIs(t, err, dlock.ErrInvalid, "no owner")
	_, err = redisson.New(e.rdb, redisson.WithWatchdogTimeout(time.Millisecond)).Lock("x").TryLock(ctx)
	assert.ErrorIs(t, err, dlock.ErrInvalid, "watchdog timeout")
	n, err := e.rdb.Exists(ctx, "x").Result()
	require.NoError(t, err)
	assert.Zero(t, n, "nothing written")
}

func TestLock_ForeignKeys_AreRefusedAndLeftAlone(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ctx := owner(ctxT(t, 10*time.Second), "job-1")
	require.NoError(t, e.rdb.Set(ctx, "str", "v", 0).Err())
	// A dlock lock's hash, as dlock lays it out under dlock:{name}.
	require.NoError(t, e.rdb.HSet(ctx, "dlock:{orders}", "k", "mutex", "o", "abc", "f", "3").Err())
	require.NoError(t, e.rdb.PExpire(ctx, "dlock:{orders}", time.Minute).Err())
	// A Redisson read-write lock.
	require.NoError(t, e.java.ReadLock(ctx, "rw", 7, time.Minute))
	for _, name := range []string{"str", "dlock:{orders}", "rw"} {
		before, err := e.rdb.Dump(ctx, name).Result()
		require.NoError(t, err)
		l := e.go_.Lock(name)
		_, err = l.TryLock(ctx)
		assert.ErrorIs(t, err, dlock.ErrInvalid, "TryLock on %s", name)
		assert.ErrorContains(t, err, name)
		err = l.Lock(ctx)
		assert.ErrorIs(t, err, dlock.ErrInvalid, "Lock on %s", name)
		_, err = l.ForceUnlock(ctx)
		assert.ErrorIs(t, err, dlock.ErrInvalid, "ForceUnlock on %s", name)
		after, err := e.rdb.Dump(ctx, name).Result()
		require.NoError(t, err)
		assert.Equal(t, before, after, "%s changed", name)
	}
}

func TestLock_ContextEnds_WhileWaiting(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ctx := ctxT(t, 10*time.Second)
	require.NoError(t, e.java.Lock(ctx, "orders", 7, 0))
	wctx, cancel := context.WithTimeout(owner(ctx, "job-1"), 200*time.Millisecond)
	defer cancel()
	err := e.go_.Lock("orders").Lock(wctx)
	assert.ErrorIs(t, err, dlock.ErrNotObtained)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	n, err := e.go_.Lock("orders").HoldCount(owner(ctx, "job-1"))
	require.NoError(t, err)
	assert.Zero(t, n)
}

func TestClient_Close_UnblocksWaitersStopsRenewalsLeaksNothing(t *testing.T) {
	srv := redistest.Real(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	ignore := goleak.IgnoreCurrent()
	c := redisson.New(rdb)
	ctx := ctxT(t, 10*time.Second)
	g := owner(ctx, "holder")
	require.NoError(t, c.Lock("held").Lock(g)) // starts the watchdog
	lost := c.Lock("held").Lost(g)
	waiter := result(func() error { return c.Lock("held").Lock(owner(ctx, "waiter")) })
	awaitSubscribers(t, rdb, "redisson_lock__channel:{held}", 1)
	require.NoError(t, c.Close())
	r := recv(t, waiter, 3*time.Second)
	assert.ErrorIs(t, r.err, dlock.ErrClosed)
	select {
	case <-lost:
	default:
		t.Fatal("Close did not end the hold")
	}
	require.NoError(t, c.Close())
	_, err := c.Lock("held").TryLock(g)
	assert.ErrorIs(t, err, dlock.ErrClosed)
	goleak.VerifyNone(t, ignore)
}

func TestLock_HolderField_IsClientIDAndOwnersThreadID(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	c := redisson.New(e.rdb, redisson.WithClientID("5b1c6e0e-3c2f-4f0a-9a57-6a1f2b0c9d11"))
	t.Cleanup(func() { _ = c.Close() })
	ctx := owner(ctxT(t, 10*time.Second), "87")
	l := c.Lock("orders")
	require.NoError(t, l.Lock(ctx))
	v, err := e.rdb.HGet(ctx, "orders", "5b1c6e0e-3c2f-4f0a-9a57-6a1f2b0c9d11:87").Result()
	require.NoError(t, err)
	assert.Equal(t, "1", v)
	require.NoError(t, l.Unlock(ctx))
	assert.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`, e.go_.ID(), "a Java-style UUID")
}

func TestLock_HoldContext_EndsAtTheLastUnlock(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ctx := owner(ctxT(t, 10*time.Second), "job-1")
	l := e.go_.Lock("orders")
	hctx, cancel := l.HoldContext(ctx)
	defer cancel()
	require.Error(t, hctx.Err(), "no hold yet")
	assert.ErrorIs(t, context.Cause(hctx), dlock.ErrNotHeld)

	require.NoError(t, l.Lock(ctx))
	require.NoError(t, l.Lock(ctx))
	hctx, cancel = l.HoldContext(ctx)
	defer cancel()
	require.NoError(t, l.Unlock(ctx))
	require.NoError(t, hctx.Err(), "one hold is left")
	require.NoError(t, l.Unlock(ctx))
	<-hctx.Done()
	assert.ErrorIs(t, context.Cause(hctx), dlock.ErrNotHeld)
	assert.NotErrorIs(t, context.Cause(hctx), dlock.ErrLost)
}

func TestLock_RedisDown_ErrorsNotPanics_AndHoldsAreLost(t *testing.T) {
	t.Parallel()
	srv := redistest.Real(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	c := redisson.New(rdb, redisson.WithWatchdogTimeout(600*time.Millisecond))
	t.Cleanup(func() { _ = c.Close() })
	ctx := owner(ctxT(t, 10*time.Second), "job-1")
	l := c.Lock("orders")
	require.NoError(t, l.Lock(ctx))
	lost := l.Lost(ctx)
	srv.Stop()
	_, err := l.TryLock(owner(ctx, "job-2"))
	assert.ErrorIs(t, err, dlock.ErrUnavailable)
	err = c.Semaphore("s").Release(ctx, 1)
	assert.ErrorIs(t, err, dlock.ErrUnavailable)
	select {
	case <-lost:
	case <-time.After(3 * time.Second):
		t.Fatal("renewals failing for a whole lease did not report the hold lost")
	}
	assert.Error(t, l.Unlock(ctx))
}

// A hold context is cancelled before Lost closes: whoever Lost wakes finds
// it done, with the loss as its cause. Before, the cancels ran after the
// Client's lock was released, once Lost had closed. Lost 20 times at the
// lease's end.
func TestLock_HoldContext_DoneBeforeLostCloses(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ctx := ctxT(t, 20*time.Second)
	g := owner(ctx, "job-1")
	for i := range 20 {
		l := e.go_.Lock("orders-" + strconv.Itoa(i)).WithLease(30 * time.Millisecond)
		require.NoError(t, l.Lock(g))
		lost := l.Lost(g)
		require.NotNil(t, lost)
		hctx, cancel := l.HoldContext(g)
		select {
		case <-lost:
		case <-time.After(2 * time.Second):
			t.Fatal("Lost did not fire when the lease ran out")
		}
		select {
		case <-hctx.Done():
		default:
			t.Fatalf("round %d: Lost closed while the hold context was still live", i)
		}
		assert.ErrorIs(t, context.Cause(hctx), dlock.ErrLost)
		cancel()
	}
}
