package dlock_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock"
)

// Eight lease-timed waiters on one Client, nobody unlocking: each must get
// the lock when the lease before it runs out, in arrival order (as
// Redisson's fair lock serves them).
func TestMutexQueue_LeaseTimedWaitersOnOneClient_ServedInOrderAsLeasesRunOut(t *testing.T) {
	e := realEnv(t) // leases must run out in real time
	c := e.client(e.rdb())
	n := name(t)
	ctx := ctxTimeout(t, 10*time.Second)
	const waiters = 8
	const lease = 300 * time.Millisecond
	var mu sync.Mutex
	var order []int
	var at []time.Duration
	start := time.Now()
	var wg sync.WaitGroup
	for i := range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := c.Mutex(n, dlock.WithLease(lease))
			if err := m.Lock(ctx); err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			mu.Lock()
			order = append(order, i)
			at = append(at, time.Since(start).Round(time.Millisecond))
			mu.Unlock()
		}()
		time.Sleep(40 * time.Millisecond)
	}
	wg.Wait()
	t.Logf("served %v at %v", order, at)
	require.Len(t, order, waiters, "every waiter served before its deadline")
	for i, w := range order {
		assert.Equal(t, i, w, "served in arrival order")
	}
	for i := 1; i < len(at); i++ {
		gap := at[i] - at[i-1]
		assert.InDelta(t, float64(lease), float64(gap), float64(150*time.Millisecond), "waiter %d got the lock when the lease before it ran out", order[i])
	}
}

// A stream of writers from two Clients, back to back: a reader must still
// get in, soon, every time (sync.RWMutex's rule: when a writer releases,
// the readers that waited go first).
func TestRWMutex_StreamOfWriters_ReadersNotStarved(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 30*time.Second)
	stop := make(chan struct{})
	var writers sync.WaitGroup
	for i := range 4 {
		c := e.client(e.rdb())
		writers.Add(1)
		go func() {
			defer writers.Done()
			rw := c.RWMutex(n, dlock.WithHandleOwner())
			octx := dlock.WithNewOwner(ctx)
			for {
				select {
				case <-stop:
					return
				default:
				}
				if !assert.NoError(t, rw.Lock(octx), "writer %d", i) {
					return
				}
				time.Sleep(2 * time.Millisecond)
				assert.NoError(t, rw.Unlock(octx))
			}
		}()
	}
	time.Sleep(50 * time.Millisecond) // the writers are in full stream
	reader := e.client(e.rdb()).RWMutex(n, dlock.WithHandleOwner())
	var worst time.Duration
	for range 20 {
		start := time.Now()
		require.NoError(t, reader.RLock(ctx))
		worst = max(worst, time.Since(start))
		require.NoError(t, reader.RUnlock(ctx))
	}
	close(stop)
	writers.Wait()
	t.Logf("20 read locks against 4 writers back to back: worst wait %v", worst)
	assert.Less(t, worst, 500*time.Millisecond, "a reader waits for at most the writer ahead of it")
}

// A holder that crashes (its lease runs out, nobody releases) leaves its
// queue to the first waiter, as soon as the lease ends, and a newcomer's
// TryLock cannot take the lock past the queue.
func TestMutexQueue_CrashedHolder_QueueHeadServedWhenTheLeaseEndsNoBarging(t *testing.T) {
	e := realEnv(t) // the crashed holder's lease must run out
	n := name(t)
	ctx := ctxTimeout(t, 10*time.Second)
	probe := e.rdb()
	const lease = 500 * time.Millisecond
	setHolder(t, probe, n, "crashed.1", lease)
	ended := time.Now().Add(lease)
	first := e.client(e.rdb()).Mutex(n)
	done := queueUp(t, ctx, probe, n, first, 1)
	barger := e.client(e.rdb()).Mutex(n)
	var got time.Time
	for {
		ok, err := barger.TryLock(ctx)
		require.NoError(t, err)
		require.False(t, ok, "a TryLock took the lock past the queue")
		select {
		case <-done:
			got = time.Now()
		default:
			time.Sleep(2 * time.Millisecond)
			continue
		}
		break
	}
	late := got.Sub(ended)
	t.Logf("the queue head got the lock %v after the crashed holder's lease ended", late.Round(time.Millisecond))
	assert.Less(t, late, 100*time.Millisecond, "served when the lease ends, not at some later timer")
	require.NoError(t, first.Unlock(ctx))
}

// A waiter at the head of the queue whose process died is handed the lock
// like any other, and holds the queue up for what is left of its waiting
// mark: at most a third of the watchdog timeout, not a whole one.
func TestMutexQueue_DeadWaiterAtTheHead_CostsAtMostItsMark(t *testing.T) {
	e := realEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 20*time.Second)
	probe := e.rdb()
	const timeout = 3 * time.Second // marks of 1s
	holder := e.client(e.rdb(), dlock.WithWatchdogTimeout(timeout)).Mutex(n)
	require.NoError(t, holder.Lock(ctx))
	// The dead waiter: its Client, reached through a proxy, queues and is
	// then cut off, as a process that died would be.
	rdb, proxy := e.proxied()
	dead := e.client(rdb, dlock.WithWatchdogTimeout(timeout)).Mutex(n)
	deadCtx, cancelDead := context.WithCancel(ctx)
	defer cancelDead()
	go func() { _ = dead.Lock(deadCtx) }()
	require.Eventually(t, func() bool { return len(queued(t, probe, n)) == 1 }, 5*time.Second, time.Millisecond)
	proxy.Partition()
	defer proxy.Heal()
	live := e.client(e.rdb(), dlock.WithWatchdogTimeout(timeout)).Mutex(n)
	done := queueUp(t, ctx, probe, n, live, 2)
	released := time.Now()
	require.NoError(t, holder.Unlock(ctx))
	within(t, done, 5*time.Second, "the live waiter, once the dead one's mark ran out")
	cost := time.Since(released)
	t.Logf("a dead waiter at the head held the lock up for %v (watchdog timeout %v, marks %v)", cost.Round(time.Millisecond), timeout, timeout/3)
	assert.LessOrEqual(t, cost, timeout/3+200*time.Millisecond, "no longer than a mark lives")
	require.NoError(t, live.Unlock(ctx))
}

// A key that expired while two waiters were queued: the first takes the
// lock, and its release must pass it on to the second, not free it for a
// newcomer (TestScripts_QueueHint pins the script-level case).
func TestMutexQueue_KeyExpiredWithWaitersQueued_ReleasePassesOnToTheNext(t *testing.T) {
	e := realEnv(t) // the key must expire in real time
	n := name(t)
	ctx := ctxTimeout(t, 15*time.Second)
	clients := make([]*dlock.Client, 3) // the holder, both waiters, a newcomer
	for i := range clients {
		clients[i] = e.client(e.rdb())
	}
	first := clients[0].Mutex(n, dlock.WithLease(400*time.Millisecond))
	require.NoError(t, first.Lock(ctx))
	waitQueued := func(want int) {
		t.Helper()
		require.Eventually(t, func() bool {
			s, err := clients[2].Status(ctx, n)
			return err == nil && s.Waiting >= want
		}, 5*time.Second, 5*time.Millisecond, "%d waiters queued", want)
	}
	b := clients[1].Mutex(n)
	bHeld, bRelease, bErr := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		if err := b.Lock(ctx); err != nil {
			bErr <- err
			return
		}
		close(bHeld)
		<-bRelease
		bErr <- b.Unlock(ctx)
	}()
	waitQueued(1)
	cm := clients[1].Mutex(n)
	cHeld := make(chan struct{})
	go func() {
		if err := cm.Lock(ctx); err != nil {
			t.Errorf("second waiter: %v", err)
			return
		}
		close(cHeld)
	}()
	waitQueued(2)

	// Nobody releases: the holder's key expires with both still queued.
	within(t, first.Lost(), 2*time.Second, "the holder's lease running out")
	within(t, bHeld, 3*time.Second, "the first waiter taking the expired lock")
	select {
	case <-cHeld:
		t.Fatal("the second waiter holds the lock together with the first")
	default:
	}
	waitQueued(1) // the second waiter is still queued behind the holder
	close(bRelease)
	require.NoError(t, <-bErr)
	ok, err := clients[2].Mutex(n).TryLock(ctx)
	require.NoError(t, err)
	assert.False(t, ok, "a newcomer took the lock that the release owed to the waiter queued")
	within(t, cHeld, time.Second, "the second waiter served by the release")
}
