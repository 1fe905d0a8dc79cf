package dlock_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock"
)

func TestRWMutex_ThreeClients_WriterAloneReadersOverlap(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	var readers, writers, maxReaders, violations, ops atomic.Int32
	var wg sync.WaitGroup
	for range 3 {
		c := e.client(e.rdb())
		for g := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rw := c.RWMutex(n, dlock.WithHandleOwner())
				ctx := dlock.WithNewOwner(ctxTimeout(t, time.Minute))
				for i := range 15 {
					if (g+i)%4 == 0 { // a quarter of the operations write
						require.NoError(t, rw.Lock(ctx))
						if writers.Add(1) != 1 || readers.Load() != 0 {
							violations.Add(1)
						}
						time.Sleep(time.Millisecond)
						writers.Add(-1)
						require.NoError(t, rw.Unlock(ctx))
					} else {
						require.NoError(t, rw.RLock(ctx))
						r := readers.Add(1)
						if writers.Load() != 0 {
							violations.Add(1)
						}
						for m := maxReaders.Load(); r > m && !maxReaders.CompareAndSwap(m, r); m = maxReaders.Load() {
						}
						time.Sleep(2 * time.Millisecond)
						readers.Add(-1)
						require.NoError(t, rw.RUnlock(ctx))
					}
					ops.Add(1)
				}
			}()
		}
	}
	wg.Wait()
	assert.Zero(t, violations.Load(), "a writer overlapped someone")
	assert.Greater(t, maxReaders.Load(), int32(1), "readers must overlap")
	t.Logf("RW operations checked: %d, violations: %d, most concurrent readers: %d", ops.Load(), violations.Load(), maxReaders.Load())
}

func TestRWMutex_SteadyReaderStream_WriterGetsIn(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	readerClient := e.client(e.rdb())
	writer := e.client(e.rdb()).RWMutex(n, dlock.WithHandleOwner())
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var reads atomic.Int32
	const hold = 20 * time.Millisecond
	// Eight readers with overlapping 20ms holds: without writer preference
	// the lock is never free of readers.
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rw := readerClient.RWMutex(n, dlock.WithHandleOwner())
			time.Sleep(time.Duration(i) * hold / 8)
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx := dlock.WithNewOwner(ctxTimeout(t, 30*time.Second))
				if !assert.NoError(t, rw.RLock(ctx)) {
					return
				}
				reads.Add(1)
				time.Sleep(hold)
				assert.NoError(t, rw.RUnlock(ctx))
			}
		}()
	}
	time.Sleep(100 * time.Millisecond)
	var worst time.Duration
	for range 5 {
		start := time.Now()
		require.NoError(t, writer.Lock(ctxTimeout(t, 10*time.Second)))
		worst = max(worst, time.Since(start))
		require.NoError(t, writer.Unlock(context.Background()))
		time.Sleep(30 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	// Bound: the readers already in finish their 20ms holds, plus handoff.
	assert.Less(t, worst, 500*time.Millisecond, "writer starved by the reader stream")
	t.Logf("writer's worst wait under a stream of 8 readers holding %v: %v (%d reads)", hold, worst, reads.Load())
}

func TestRWMutex_Downgrade_WriteThenReadThenUnlockKeepsRead(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	c := e.client(e.rdb())
	rw, other, third := c.RWMutex(n, dlock.WithHandleOwner()), c.RWMutex(n, dlock.WithHandleOwner()), c.RWMutex(n, dlock.WithHandleOwner())
	ctx := context.Background()
	require.NoError(t, rw.Lock(ctx))
	ok, err := other.TryRLock(ctx)
	require.NoError(t, err)
	assert.False(t, ok, "no reader while writing")
	require.NoError(t, rw.RLock(ctx)) // downgrade
	require.NoError(t, rw.Unlock(ctx))
	ok, err = other.TryRLock(ctx)
	require.NoError(t, err)
	assert.True(t, ok, "after the downgrade others may read")
	ok, err = third.TryLock(ctx)
	require.NoError(t, err)
	assert.False(t, ok, "no writer while two read")
	require.NoError(t, other.RUnlock(ctx))
	require.NoError(t, rw.RUnlock(ctx))
	ok, err = third.TryLock(ctx)
	require.NoError(t, err)
	assert.True(t, ok, "free after the last reader")
	require.NoError(t, third.Unlock(ctx))
}

func TestRWMutex_ReaderAsksForWrite_ErrUpgradeAtOnce(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	c := e.client(e.rdb())
	rw, other := c.RWMutex(n, dlock.WithHandleOwner()), c.RWMutex(n, dlock.WithHandleOwner())
	ctx := context.Background()
	require.NoError(t, rw.RLock(ctx))
	start := time.Now()
	err := rw.Lock(ctxTimeout(t, 5*time.Second))
	assert.ErrorIs(t, err, dlock.ErrUpgrade)
	assert.Less(t, time.Since(start), time.Second)
	_, err = rw.TryLock(ctx)
	assert.ErrorIs(t, err, dlock.ErrUpgrade)
	ok, err := other.TryRLock(ctx)
	require.NoError(t, err)
	assert.True(t, ok, "the refused upgrade left no waiting mark")
	require.NoError(t, other.RUnlock(ctx))
	require.NoError(t, rw.RUnlock(ctx))
	assert.ErrorIs(t, rw.RUnlock(ctx), dlock.ErrNotHeld)
	assert.ErrorIs(t, rw.Unlock(ctx), dlock.ErrNotHeld)
}

func TestRWMutex_CrashedReader_BlocksWriterOnlyUntilItsLease(t *testing.T) {
	e := realEnv(t)
	n := name(t)
	const timeout = time.Second
	crashed := dlock.New(e.rdb(), dlock.WithWatchdogTimeout(timeout))
	require.NoError(t, crashed.RWMutex(n, dlock.WithHandleOwner()).RLock(context.Background()))
	start := time.Now()
	require.NoError(t, crashed.Close()) // renewals stop; the read hold is never released
	writer := e.client(e.rdb()).RWMutex(n, dlock.WithHandleOwner())
	require.NoError(t, writer.Lock(ctxTimeout(t, 10*time.Second)))
	d := time.Since(start)
	assert.Less(t, d, timeout+time.Second, "the writer waits for the lease, not longer")
	t.Logf("writer got in %v after the reader stopped renewing (lease %v)", d, timeout)
	require.NoError(t, writer.Unlock(context.Background()))
}

func TestRWMutex_WriterRelease_WakesAllReaders(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	writer := e.client(e.rdb()).RWMutex(n, dlock.WithHandleOwner())
	ctx := ctxTimeout(t, 30*time.Second)
	require.NoError(t, writer.Lock(ctx))
	var inside, most atomic.Int32
	var wg sync.WaitGroup
	for range 2 {
		c := e.client(e.rdb())
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rw := c.RWMutex(n, dlock.WithHandleOwner())
				octx := dlock.WithNewOwner(ctx)
				require.NoError(t, rw.RLock(octx))
				r := inside.Add(1)
				for m := most.Load(); r > m && !most.CompareAndSwap(m, r); m = most.Load() {
				}
				time.Sleep(200 * time.Millisecond)
				inside.Add(-1)
				require.NoError(t, rw.RUnlock(octx))
			}()
		}
	}
	time.Sleep(200 * time.Millisecond)
	released := time.Now()
	require.NoError(t, writer.Unlock(ctx))
	within(t, waitGroupDone(&wg), 5*time.Second, "readers after the writer's release")
	assert.EqualValues(t, 8, most.Load(), "all eight readers were let in together")
	t.Logf("8 readers on 2 Clients all in and out %v after the writer's release", time.Since(released))
}

func TestRWMutex_WaitingWriterGivesUp_ReadersBehindItProceed(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	c := e.client(e.rdb())
	first := c.RWMutex(n, dlock.WithHandleOwner())
	ctx := ctxTimeout(t, 30*time.Second)
	require.NoError(t, first.RLock(ctx))
	wctx, cancel := context.WithCancel(ctx)
	writerDone := make(chan error, 1)
	go func() { writerDone <- e.client(e.rdb()).RWMutex(n, dlock.WithHandleOwner()).Lock(wctx) }()
	time.Sleep(100 * time.Millisecond) // the writer waits, its mark keeps readers out
	ok, err := c.RWMutex(n, dlock.WithHandleOwner()).TryRLock(ctx)
	require.NoError(t, err)
	require.False(t, ok, "a waiting writer keeps new readers out")
	readerIn := make(chan struct{})
	go func() {
		defer close(readerIn)
		assert.NoError(t, e.client(e.rdb()).RWMutex(n, dlock.WithHandleOwner()).RLock(ctx))
	}()
	time.Sleep(100 * time.Millisecond)
	cancel()
	assert.ErrorIs(t, <-writerDone, dlock.ErrNotObtained)
	within(t, readerIn, 2*time.Second, "the queued reader once the writer gave up")
	require.NoError(t, first.RUnlock(ctx))
}

func TestRWMutex_RandomMixUnderCancellation_LeavesNothingBehind(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	rdb := e.rdb()
	c := e.client(rdb)
	var wg sync.WaitGroup
	for i := range 30 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rw := c.RWMutex(n, dlock.WithHandleOwner())
			ctx, cancel := context.WithTimeout(dlock.WithNewOwner(context.Background()), time.Duration(1+rand.IntN(20))*time.Millisecond)
			defer cancel()
			if i%3 == 0 {
				if rw.Lock(ctx) == nil {
					time.Sleep(time.Millisecond)
					assert.NoError(t, rw.Unlock(ctx))
				}
			} else if rw.RLock(ctx) == nil {
				time.Sleep(2 * time.Millisecond)
				assert.NoError(t, rw.RUnlock(ctx))
			}
		}()
	}
	wg.Wait()
	assert.Empty(t, holderOf(t, rdb, n), "nobody writes")
	for _, suffix := range []string{":rl", ":rc", ":mq", ":mqe"} {
		exists, err := rdb.Exists(context.Background(), key(n)+suffix).Result()
		require.NoError(t, err)
		assert.Zero(t, exists, "key %s left behind", key(n)+suffix)
	}
}

func TestRWMutex_WatchdogRenewsReadLeasesAndWaitingMarks(t *testing.T) {
	e := realEnv(t)
	n := name(t)
	const timeout = 900 * time.Millisecond
	readers := e.client(e.rdb(), dlock.WithWatchdogTimeout(timeout))
	writers := e.client(e.rdb(), dlock.WithWatchdogTimeout(timeout))
	ctx := ctxTimeout(t, 30*time.Second)
	r := readers.RWMutex(n, dlock.WithHandleOwner())
	rctx := dlock.WithNewOwner(ctx)
	require.NoError(t, r.RLock(rctx))
	require.NoError(t, r.RLock(rctx)) // nested read
	got := make(chan struct{})
	go func() {
		defer close(got)
		assert.NoError(t, writers.RWMutex(n, dlock.WithHandleOwner()).Lock(ctx))
	}()
	time.Sleep(3 * timeout) // both the read lease and the writer's mark outlive 3 leases only if renewed
	select {
	case <-got:
		t.Fatal("the writer got in while the reader held its renewed lease")
	case <-r.RLost(rctx):
		t.Fatal("read hold lost although renewed")
	default:
	}
	ok, err := readers.RWMutex(n, dlock.WithHandleOwner()).TryRLock(ctx)
	require.NoError(t, err)
	assert.False(t, ok, "the waiting writer's mark must still keep new readers out")
	require.NoError(t, r.RUnlock(rctx))
	select {
	case <-got:
		t.Fatal("one of two nested read holds is still held")
	case <-time.After(100 * time.Millisecond):
	}
	require.NoError(t, r.RUnlock(rctx))
	within(t, got, 2*time.Second, "the writer after the last read hold")
}
