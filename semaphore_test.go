package dlock_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
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

func TestSemaphore_ThreeClientsRandomN_PermitsNeverExceedTotal(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	const total = 5
	ok, err := e.client(e.rdb()).Semaphore(n).TrySetPermits(context.Background(), total)
	require.NoError(t, err)
	require.True(t, ok)
	var inUse, most, over, acquisitions atomic.Int32
	var wg sync.WaitGroup
	for range 3 {
		c := e.client(e.rdb())
		for range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s := c.Semaphore(n)
				ctx := ctxTimeout(t, time.Minute)
				for range 10 {
					k := 1 + rand.IntN(3)
					p, err := s.Acquire(ctx, k)
					if !assert.NoError(t, err) {
						return
					}
					cur := inUse.Add(int32(k))
					if cur > total {
						over.Add(1)
					}
					for m := most.Load(); cur > m && !most.CompareAndSwap(m, cur); m = most.Load() {
					}
					acquisitions.Add(1)
					time.Sleep(time.Millisecond)
					inUse.Add(-int32(k))
					assert.NoError(t, p.Release(ctx))
				}
			}()
		}
	}
	wg.Wait()
	assert.Zero(t, over.Load(), "permits in use exceeded the total")
	avail, err := e.client(e.rdb()).Semaphore(n).Available(context.Background())
	require.NoError(t, err)
	assert.Equal(t, total, avail, "every permit came back")
	t.Logf("semaphore acquisitions checked: %d, over-use seen: %d, most permits in use at once: %d of %d",
		acquisitions.Load(), over.Load(), most.Load(), total)
}

func TestSemaphore_CrashedHolder_PermitsReturnAfterLease(t *testing.T) {
	e := realEnv(t)
	n := name(t)
	const timeout = time.Second
	admin := e.client(e.rdb()).Semaphore(n)
	ctx := ctxTimeout(t, 30*time.Second)
	_, err := admin.TrySetPermits(ctx, 3)
	require.NoError(t, err)
	crashed := dlock.New(e.rdb(), dlock.WithWatchdogTimeout(timeout))
	_, err = crashed.Semaphore(n).Acquire(ctx, 2)
	require.NoError(t, err)
	start := time.Now()
	require.NoError(t, crashed.Close()) // no Release; renewals stop

	avail, err := admin.Available(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, avail)
	p, err := admin.Acquire(ctx, 3) // waits for the crashed holder's lease
	require.NoError(t, err)
	d := time.Since(start)
	assert.Less(t, d, timeout+time.Second)
	t.Logf("a crashed holder's 2 permits came back after %v (lease %v)", d, timeout)
	require.NoError(t, p.Release(ctx))
}

func TestSemaphore_LargeRequest_NotStarvedBySmallOnes(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 30*time.Second)
	_, err := e.client(e.rdb()).Semaphore(n).TrySetPermits(ctx, 4)
	require.NoError(t, err)
	small := e.client(e.rdb())
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var smallGrants atomic.Int32
	for i := range 8 { // 8 callers for 4 permits: never all free without fairness
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := small.Semaphore(n)
			time.Sleep(time.Duration(i) * time.Millisecond)
			for {
				select {
				case <-stop:
					return
				default:
				}
				p, err := s.Acquire(ctx, 1)
				if !assert.NoError(t, err) {
					return
				}
				smallGrants.Add(1)
				time.Sleep(10 * time.Millisecond)
				assert.NoError(t, p.Release(ctx))
			}
		}()
	}
	time.Sleep(100 * time.Millisecond)
	big := e.client(e.rdb()).Semaphore(n)
	var worst time.Duration
	for range 3 {
		start := time.Now()
		p, err := big.Acquire(ctx, 4)
		require.NoError(t, err)
		worst = max(worst, time.Since(start))
		require.NoError(t, p.Release(ctx))
		time.Sleep(20 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	assert.Less(t, worst, time.Second, "Acquire(4) starved by Acquire(1) callers")
	t.Logf("Acquire(4) against 8 callers of Acquire(1) holding 10ms: worst wait %v (%d small grants)", worst, smallGrants.Load())
}

func TestSemaphore_DoubleReleaseAndExpiredRelease_ErrNotHeldCountUnchanged(t *testing.T) {
	e := realEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 10*time.Second)
	s := e.client(e.rdb()).Semaphore(n)
	_, err := s.TrySetPermits(ctx, 3)
	require.NoError(t, err)
	p, err := s.Acquire(ctx, 2)
	require.NoError(t, err)
	require.NoError(t, p.Release(ctx))
	assert.ErrorIs(t, p.Release(ctx), dlock.ErrNotHeld)
	avail, err := s.Available(ctx)
	require.NoError(t, err)
	assert.Equal(t, 3, avail, "a second Release adds nothing")

	short := e.client(e.rdb()).Semaphore(n, dlock.WithPermitLease(100*time.Millisecond))
	p, err = short.Acquire(ctx, 2)
	require.NoError(t, err)
	within(t, p.Lost(), 2*time.Second, "the permit's lost signal at lease end")
	// The client counts the lease from before its request was sent, so it
	// reports the loss before the server expires the permit: by a few ms,
	// or by a slow request's transit on a loaded machine. Wait for the
	// server's expiry before the late Release.
	require.Eventually(t, func() bool {
		avail, err := s.Available(ctx)
		return err == nil && avail == 3
	}, 2*time.Second, 5*time.Millisecond, "the server expiring the permit")
	err = p.Release(ctx)
	assert.ErrorIs(t, err, dlock.ErrNotHeld)
	assert.ErrorIs(t, err, dlock.ErrLost)
	avail, err = s.Available(ctx)
	require.NoError(t, err)
	assert.Equal(t, 3, avail, "an expired permit's Release adds nothing")
}

func TestSemaphore_CancelledAcquire_LeavesCountAndQueueExact(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	rdb := e.rdb()
	s := e.client(rdb).Semaphore(n)
	ctx := ctxTimeout(t, 10*time.Second)
	_, err := s.TrySetPermits(ctx, 2)
	require.NoError(t, err)
	held, err := s.Acquire(ctx, 2)
	require.NoError(t, err)
	_, err = e.client(e.rdb()).Semaphore(n).Acquire(ctxTimeout(t, 100*time.Millisecond), 1)
	assert.ErrorIs(t, err, dlock.ErrNotObtained)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	queued, err := rdb.ZCard(ctx, key(n)+":q").Result()
	require.NoError(t, err)
	assert.Zero(t, queued, "the cancelled waiter left the queue")
	require.NoError(t, held.Release(ctx))
	avail, err := s.Available(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, avail)
}

func TestSemaphore_Release_WakesWaitersUpToFreedPermits(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 30*time.Second)
	holder := e.client(e.rdb()).Semaphore(n)
	_, err := holder.TrySetPermits(ctx, 3)
	require.NoError(t, err)
	p, err := holder.Acquire(ctx, 3)
	require.NoError(t, err)
	var got atomic.Int32
	var wg sync.WaitGroup
	for range 3 {
		s := e.client(e.rdb()).Semaphore(n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			q, err := s.Acquire(ctx, 1)
			if assert.NoError(t, err) {
				got.Add(1)
				time.Sleep(300 * time.Millisecond)
				assert.NoError(t, q.Release(ctx))
			}
		}()
	}
	time.Sleep(200 * time.Millisecond)
	require.NoError(t, p.Release(ctx))
	require.Eventually(t, func() bool { return got.Load() == 3 }, time.Second, 5*time.Millisecond,
		"three waiters on three Clients woken by one release of three permits")
	wg.Wait()
}

func TestSemaphore_BadInput_ClearErrorsNothingChanged(t *testing.T) {
	e := sharedEnv(t)
	rdb := e.rdb()
	c := e.client(rdb)
	n := name(t)
	s := c.Semaphore(n)
	ctx := context.Background()
	_, err := s.TrySetPermits(ctx, 0)
	assert.ErrorIs(t, err, dlock.ErrInvalid)
	_, err = s.TrySetPermits(ctx, -2)
	assert.ErrorIs(t, err, dlock.ErrInvalid)
	ok, err := s.TrySetPermits(ctx, 2)
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = s.TrySetPermits(ctx, 5)
	require.NoError(t, err)
	assert.False(t, ok, "already set")
	zero, err := s.Acquire(ctx, 0)
	require.NoError(t, err, "no permits: at once, as x/sync and Redisson do")
	assert.Zero(t, zero.Count())
	assert.Zero(t, zero.Token())
	assert.NoError(t, zero.Release(ctx))
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, err = s.Acquire(short, 3)
	assert.ErrorIs(t, err, dlock.ErrNotObtained, "more than the total waits for the total to grow")
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	_, err = s.TryAcquire(ctx, 3)
	assert.ErrorIs(t, err, dlock.ErrNotObtained, "more than the total")
	_, err = s.TryAcquire(ctx, -1)
	assert.ErrorIs(t, err, dlock.ErrInvalid)
	assert.ErrorIs(t, s.AddPermits(ctx, -3), dlock.ErrInvalid)
	avail, err := s.Available(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, avail, "failed calls changed nothing")
	require.NoError(t, s.AddPermits(ctx, -1))
	avail, err = s.Available(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, avail)

	_, err = c.Semaphore("").Available(ctx)
	assert.ErrorIs(t, err, dlock.ErrInvalid)
	_, err = c.Semaphore(n, dlock.WithPermitLease(-time.Second)).TryAcquire(ctx, 1)
	assert.ErrorIs(t, err, dlock.ErrInvalid)

	wrong := name(t) + "-wrong"
	require.NoError(t, rdb.Set(ctx, key(wrong), "x", 0).Err())
	_, err = c.Semaphore(wrong).TryAcquire(ctx, 1)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "not a lock of this kind")
	v, err := rdb.Get(ctx, key(wrong)).Result()
	require.NoError(t, err)
	assert.Equal(t, "x", v)
}

func TestSemaphore_TryAcquire_ShortReturnsErrNotObtained(t *testing.T) {
	e := sharedEnv(t)
	s := e.client(e.rdb()).Semaphore(name(t))
	ctx := context.Background()
	_, err := s.TrySetPermits(ctx, 2)
	require.NoError(t, err)
	p, err := s.TryAcquire(ctx, 2)
	require.NoError(t, err)
	assert.Equal(t, 2, p.Count())
	_, err = s.TryAcquire(ctx, 1)
	assert.ErrorIs(t, err, dlock.ErrNotObtained)
	require.NoError(t, p.Release(ctx))
}

// Counts beyond MaxPermits are refused before anything is sent, with an
// error that names the bound; an AddPermits whose sum would pass it is
// refused by its script, changing nothing. Counts up to it are exact.
func TestSemaphore_CountsBeyondMaxPermits_ErrInvalidNothingChanged(t *testing.T) {
	e := realEnv(t) // snapshot DUMPs every key, which miniredis cannot
	rdb := e.rdb()
	cnt := newCounter()
	s := e.client(e.rdb(cnt)).Semaphore(name(t))
	n := s.Name()
	ctx := ctxTimeout(t, 10*time.Second)
	bound := fmt.Sprint(int64(dlock.MaxPermits))

	refused := map[string]func() error{
		"TrySetPermits(MaxInt)":       func() error { return dropOK(s.TrySetPermits(ctx, math.MaxInt)) },
		"TrySetPermits(MaxPermits+1)": func() error { return dropOK(s.TrySetPermits(ctx, dlock.MaxPermits+1)) },
		"SetPermits(MaxInt)":          func() error { return s.SetPermits(ctx, math.MaxInt) },
		"AddPermits(MaxInt)":          func() error { return s.AddPermits(ctx, math.MaxInt) },
		"AddPermits(-MaxInt)":         func() error { return s.AddPermits(ctx, -math.MaxInt) },
		"AddPermits(MaxPermits+1)":    func() error { return s.AddPermits(ctx, dlock.MaxPermits+1) },
		"TryAcquire(MaxInt)":          func() error { return dropOK(s.TryAcquire(ctx, math.MaxInt)) },
		"Acquire(MaxPermits+1)":       func() error { return dropOK(s.Acquire(ctx, dlock.MaxPermits+1)) },
	}
	check := func(what string, call func() error) {
		t.Helper()
		before := snapshot(t, ctx, rdb, n)
		err := call()
		assert.ErrorIs(t, err, dlock.ErrInvalid, what)
		if assert.Error(t, err, what) {
			assert.Contains(t, err.Error(), bound, "%s: the error names the bound", what)
		}
		assert.Equal(t, before, snapshot(t, ctx, rdb, n), "%s changed Redis", what)
	}
	cnt.reset()
	for what, call := range refused {
		check(what, call)
	}
	assert.Zero(t, cnt.total(), "counts beyond MaxPermits must be refused before anything is sent")

	ok, err := s.TrySetPermits(ctx, dlock.MaxPermits)
	require.NoError(t, err)
	require.True(t, ok)
	check("AddPermits(1) past MaxPermits", func() error { return s.AddPermits(ctx, 1) })
	for what, call := range refused {
		check(what+" on a set total", call)
	}
	total, err := s.Total(ctx)
	require.NoError(t, err)
	assert.Equal(t, dlock.MaxPermits, total, "the total is exact up to MaxPermits")
	p, err := s.TryAcquire(ctx, dlock.MaxPermits-1)
	require.NoError(t, err)
	avail, err := s.Available(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, avail)
	require.NoError(t, p.Release(ctx))
	require.NoError(t, s.AddPermits(ctx, -(dlock.MaxPermits-1)))
	total, err = s.Total(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, total)
}

// A Drain whose reply is lost gives back whatever its script may have taken:
// the free permits are free again at once, not after a whole lease.
func TestSemaphore_DrainReplyLost_GivesPermitsBack(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 10*time.Second)
	require.NoError(t, scripts.SemDrain.Load(ctx, e.rdb()).Err())
	s := e.client(e.rdb(&replyLost{match: firstCallOf(scripts.SemDrain)})).Semaphore(n)
	_, err := s.TrySetPermits(ctx, 3)
	require.NoError(t, err)
	p, err := s.Drain(ctx)
	require.Error(t, err, "the reply was lost")
	assert.Nil(t, p)
	avail, err := e.client(e.rdb()).Semaphore(n).Available(ctx)
	require.NoError(t, err)
	assert.Equal(t, 3, avail, "the drained permits stay taken, unrenewed, for a whole lease")
	q, err := s.Drain(ctx)
	require.NoError(t, err)
	assert.Equal(t, 3, q.Count(), "a later Drain takes them")
	require.NoError(t, q.Release(ctx))
}

// A queued request for more than the total holds nobody back: with a total
// of 1 and an Acquire(2) queued first, an Acquire(1) is served at once.
// Once the total is raised to cover it, the large request takes its turn in
// arrival order again: a later small request waits behind it.
func TestSemaphore_RequestAboveTotal_HoldsNobodyBackUntilTheTotalCoversIt(t *testing.T) {
	e := sharedEnv(t)
	rdb := e.rdb()
	n := name(t)
	ctx := ctxTimeout(t, 20*time.Second)
	admin := e.client(e.rdb()).Semaphore(n)
	_, err := admin.TrySetPermits(ctx, 1)
	require.NoError(t, err)
	queued := func(want int64) { t.Helper(); semQueued(t, ctx, rdb, n, want) }

	bigDone := make(chan *dlock.Permit, 1)
	go func() {
		p, err := e.client(e.rdb()).Semaphore(n).Acquire(ctx, 2)
		assert.NoError(t, err)
		bigDone <- p
	}()
	queued(1)

	small := e.client(e.rdb()).Semaphore(n)
	start := time.Now()
	d, err := small.Drain(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, d.Count(), "Drain passes over a request for more than the total")
	require.NoError(t, d.Release(ctx))
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	p1, err := small.Acquire(sctx, 1)
	require.NoError(t, err, "Acquire(1) held back by a queued Acquire(2) on a total of 1")
	assert.Less(t, time.Since(start), 500*time.Millisecond)

	// The total now covers the large request: it is first in line again.
	require.NoError(t, admin.AddPermits(ctx, 1))
	_, err = small.TryAcquire(ctx, 1)
	assert.ErrorIs(t, err, dlock.ErrNotObtained, "a small request passed the large one that now fits")
	laterDone := make(chan *dlock.Permit, 1)
	go func() {
		p, err := e.client(e.rdb()).Semaphore(n).Acquire(ctx, 1)
		assert.NoError(t, err)
		laterDone <- p
	}()
	queued(2)
	select {
	case <-bigDone:
		t.Fatal("Acquire(2) served with one permit held")
	case <-laterDone:
		t.Fatal("a later Acquire(1) passed the Acquire(2) queued ahead of it")
	case <-time.After(200 * time.Millisecond):
	}
	require.NoError(t, p1.Release(ctx))
	var big *dlock.Permit
	select {
	case big = <-bigDone:
		assert.Equal(t, 2, big.Count())
	case <-time.After(2 * time.Second):
		t.Fatal("Acquire(2) not served in its turn once the total covered it")
	}
	select {
	case <-laterDone:
		t.Fatal("the later Acquire(1) served while Acquire(2) holds every permit")
	case <-time.After(100 * time.Millisecond):
	}
	require.NoError(t, big.Release(ctx))
	select {
	case p := <-laterDone:
		require.NoError(t, p.Release(ctx))
	case <-time.After(2 * time.Second):
		t.Fatal("the later Acquire(1) not served after the Acquire(2)")
	}
}

// A release reads the queue in batches, about as many requests as it can
// serve: a request behind more requests for more than the total than one
// batch holds is still served by the release, not by its own later try.
func TestSemaphore_Release_ServesARequestBehindManyTooLargeOnes(t *testing.T) {
	e := sharedEnv(t)
	rdb := e.rdb()
	n := name(t)
	ctx := ctxTimeout(t, 20*time.Second)
	c := e.client(e.rdb())
	s := c.Semaphore(n)
	_, err := s.TrySetPermits(ctx, 1)
	require.NoError(t, err)
	p, err := s.Acquire(ctx, 1)
	require.NoError(t, err)
	queued := func(want int64) { t.Helper(); semQueued(t, ctx, rdb, n, want) }
	const large = 20 // more than the first batch (free permits + 8) and more than its double
	bigCtx, stopBig := context.WithCancel(ctx)
	var bigs sync.WaitGroup
	t.Cleanup(func() {
		stopBig()
		bigs.Wait()
	})
	for i := range large {
		bigs.Go(func() {
			_, err := c.Semaphore(n).Acquire(bigCtx, 2) // more than the total: never served
			assert.ErrorIs(t, err, dlock.ErrNotObtained)
		})
		queued(int64(i + 1))
	}
	// The small request's Client is subscribed before the release, so that
	// no confirmation makes it look again on its own (the channel is the
	// name's, whatever the kind).
	c2 := e.client(e.rdb())
	require.Eventually(t, func() bool { return dlock.ChannelConfirmed(c2, c2.Mutex(n)) }, 5*time.Second, time.Millisecond)
	smallDone := make(chan *dlock.Permit, 1)
	go func() {
		q, err := c2.Semaphore(n).Acquire(ctx, 1)
		assert.NoError(t, err)
		smallDone <- q
	}()
	queued(large + 1)
	time.Sleep(20 * time.Millisecond) // its wait has begun

	require.NoError(t, p.Release(ctx))
	select {
	case q := <-smallDone:
		require.NoError(t, q.Release(ctx))
	case <-time.After(time.Second):
		t.Fatal("the request behind the large ones was not served by the release")
	}
	stopBig()
	bigs.Wait()
}

// semQueued waits until semaphore n has want requests queued.
func semQueued(t *testing.T, ctx context.Context, rdb *redis.Client, n string, want int64) {
	t.Helper()
	require.Eventually(t, func() bool {
		got, err := rdb.ZCard(ctx, key(n)+":q").Result()
		return err == nil && got == want
	}, 5*time.Second, 2*time.Millisecond, "%d queued", want)
}
