package dlock_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/scripts"
)

func tries(c *counter) int {
	_, cmds := c.snapshot()
	return cmds["evalsha:"+scripts.ExclTry.Hash()] + cmds["eval:"+scripts.ExclTry.Hash()]
}

func TestWait_BlockedTwoSeconds_FewAttemptsAndPromptHandoff(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	holder := e.client(e.rdb()).Mutex(n)
	cnt := newCounter()
	waiter := e.client(e.rdb(cnt)).Mutex(n)
	ctx := ctxTimeout(t, 30*time.Second)

	require.NoError(t, holder.Lock(ctx))
	var acquiredAt atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		assert.NoError(t, waiter.Lock(ctx))
		acquiredAt.Store(time.Now().UnixNano())
	}()
	time.Sleep(2 * time.Second)
	attempts := tries(cnt)
	assert.LessOrEqual(t, attempts, 3, "a blocked waiter must not poll")
	released := time.Now()
	require.NoError(t, holder.Unlock(ctx))
	within(t, done, 2*time.Second, "waiter acquiring after release")
	handoff := time.Duration(acquiredAt.Load() - released.UnixNano())
	assert.Less(t, handoff, time.Second, "woken by the release, not by the 30s lease")
	t.Logf("attempts in 2s blocked: %d; handoff to a waiter on another Client: %v", attempts, handoff)
	require.NoError(t, waiter.Unlock(ctx))
}

func TestWait_HandoffLatency_Distribution(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	holder := e.client(e.rdb()).Mutex(n)
	waiter := e.client(e.rdb()).Mutex(n)
	ctx := ctxTimeout(t, 30*time.Second)
	const rounds = 50
	lat := make([]time.Duration, 0, rounds)
	for range rounds {
		require.NoError(t, holder.Lock(ctx))
		got := make(chan time.Time, 1)
		go func() {
			assert.NoError(t, waiter.Lock(ctx))
			got <- time.Now()
		}()
		time.Sleep(5 * time.Millisecond) // let the waiter block
		released := time.Now()
		require.NoError(t, holder.Unlock(ctx))
		lat = append(lat, (<-got).Sub(released))
		require.NoError(t, waiter.Unlock(ctx))
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	p50, p99 := lat[len(lat)/2], lat[len(lat)*99/100]
	assert.Less(t, p99, time.Second, "every handoff woken by a message")
	t.Logf("handoff Unlock-return to Lock-return across Clients, %d rounds: p50 %v p99 %v", rounds, p50, p99)
}

func TestWait_LeaseRunsOutWithoutRelease_WaiterWakesByTimer(t *testing.T) {
	e := realEnv(t)
	n := name(t)
	holder := e.client(e.rdb()).Mutex(n, dlock.WithLease(300*time.Millisecond))
	waiter := e.client(e.rdb()).Mutex(n)
	ctx := ctxTimeout(t, 10*time.Second)
	require.NoError(t, holder.Lock(ctx))
	start := time.Now()
	require.NoError(t, waiter.Lock(ctx)) // nobody publishes: only the lease timer can wake it
	d := time.Since(start)
	assert.Less(t, d, 2*time.Second)
	t.Logf("waiter acquired %v after a 300ms lease ran out unreleased", d)
	require.NoError(t, waiter.Unlock(ctx))
}

// blockWaiters starts perClient waiters on each Client, all blocked on the
// held lock n; each takes the lock, bumps a counter, and releases.
func blockWaiters(t *testing.T, clients []*dlock.Client, n string, perClient int, served *atomic.Int32) *sync.WaitGroup {
	var wg sync.WaitGroup
	ctx := ctxTimeout(t, 30*time.Second)
	for _, c := range clients {
		for range perClient {
			m := c.Mutex(n)
			wg.Add(1)
			go func() {
				defer wg.Done()
				if !assert.NoError(t, m.Lock(ctx)) {
					return
				}
				served.Add(1)
				assert.NoError(t, m.Unlock(ctx))
			}()
		}
	}
	return &wg
}

func waitGroupDone(wg *sync.WaitGroup) <-chan struct{} {
	ch := make(chan struct{})
	go func() { wg.Wait(); close(ch) }()
	return ch
}

// blockedScene is a lock held through one Client, with waiters blocked on it
// through two others, on a dedicated redis-server that the test may hurt.
type blockedScene struct {
	e       *env
	ctx     context.Context
	holder  *dlock.Mutex
	waiters int
	served  atomic.Int32
	wg      *sync.WaitGroup
}

func newBlockedScene(t *testing.T, perClient int, holderOpts ...dlock.Option) *blockedScene {
	e := realEnv(t)
	n := name(t)
	s := &blockedScene{e: e, ctx: ctxTimeout(t, 30*time.Second), waiters: 2 * perClient}
	s.holder = e.client(e.rdb(), holderOpts...).Mutex(n)
	require.NoError(t, s.holder.Lock(s.ctx))
	clients := []*dlock.Client{e.client(e.rdb()), e.client(e.rdb())}
	s.wg = blockWaiters(t, clients, n, perClient, &s.served) // any error, NOSCRIPT included, fails the test
	time.Sleep(300 * time.Millisecond)                       // all blocked and subscribed
	return s
}

func (s *blockedScene) allServed(t *testing.T, d time.Duration, what string) {
	t.Helper()
	within(t, waitGroupDone(s.wg), d, what)
	assert.EqualValues(t, s.waiters, s.served.Load())
}

func TestWait_PubSubConnectionKilled_AllWaitersStillAcquire(t *testing.T) {
	s := newBlockedScene(t, 5) // 30s watchdog lease: no timer rescues a stranded waiter
	require.Equal(t, 2, pubsubConns(t, s.e.rdb()), "one pub/sub connection per Client")
	killed, err := s.e.srv.Do(s.ctx, "client", "kill", "type", "pubsub")
	require.NoError(t, err)
	require.EqualValues(t, 2, killed)
	// Release at once: the message is published while no one is subscribed.
	require.NoError(t, s.holder.Unlock(s.ctx))
	s.allServed(t, 10*time.Second, "all waiters acquiring after CLIENT KILL TYPE pubsub")
}

func TestWait_ScriptFlushWhileBlocked_AllWaitersAcquireWithoutNoScript(t *testing.T) {
	s := newBlockedScene(t, 5)
	_, err := s.e.srv.Do(s.ctx, "script", "flush")
	require.NoError(t, err)
	require.NoError(t, s.holder.Unlock(s.ctx))
	s.allServed(t, 10*time.Second, "all waiters acquiring after SCRIPT FLUSH")
}

func TestWait_RedisRestartWhileBlocked_WaitersAcquireAndHolderLearnsLoss(t *testing.T) {
	s := newBlockedScene(t, 3, dlock.WithWatchdogTimeout(1500*time.Millisecond))
	s.e.srv.Restart(t) // empty dataset, empty script cache, every connection dropped
	s.allServed(t, 15*time.Second, "all waiters acquiring after a restart")
	within(t, s.holder.Lost(), 5*time.Second, "the holder's lost signal after the restart")
}

func TestWait_TenThousandWaiters_OnePubSubConnection(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000 waiters; skipped with -short")
	}
	e := realEnv(t)
	const keys, perKey = 1000, 10
	holderClient := e.client(e.rdb())
	c := e.client(e.rdb())
	ctx := ctxTimeout(t, 2*time.Minute)
	base := name(t)
	holders := make([]*dlock.Mutex, keys)
	for i := range holders {
		holders[i] = holderClient.Mutex(fmt.Sprintf("%s-%d", base, i))
		require.NoError(t, holders[i].Lock(ctx))
	}
	var served atomic.Int32
	var wg sync.WaitGroup
	for i := range keys * perKey {
		m := c.Mutex(fmt.Sprintf("%s-%d", base, i%keys))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if assert.NoError(t, m.Lock(ctx)) {
				served.Add(1)
				assert.NoError(t, m.Unlock(ctx))
			}
		}()
	}
	// Wait until every waiter is queued and subscribed.
	probe := e.rdb()
	require.Eventually(t, func() bool {
		chans, err := probe.PubSubChannels(ctx, dlock.DefaultKeyPrefix+"{"+base+"-*").Result()
		return err == nil && len(chans) == keys
	}, time.Minute, 50*time.Millisecond, "every lock's channel subscribed")
	time.Sleep(200 * time.Millisecond)
	assert.Equal(t, 1, pubsubConns(t, probe), "10,000 waiters share one pub/sub connection")
	assert.Zero(t, served.Load())

	start := time.Now()
	for _, h := range holders {
		require.NoError(t, h.Unlock(ctx))
	}
	within(t, waitGroupDone(&wg), time.Minute, "all 10,000 waiters served")
	assert.EqualValues(t, keys*perKey, served.Load())
	t.Logf("10,000 waiters on 1,000 keys: 1 pub/sub connection; all served %v after the mass release", time.Since(start))
}
