package dlock_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/scripts"
)

func renewCalls(c *counter) int {
	_, cmds := c.snapshot()
	return cmds["evalsha:"+scripts.Renew.Hash()] + cmds["eval:"+scripts.Renew.Hash()]
}

func TestWatchdog_OneSecondTimeout_KeepsHoldForFourSeconds(t *testing.T) {
	long(t)
	e := realEnv(t)
	cnt := newCounter()
	rdb := e.rdb(cnt)
	c := e.client(rdb, dlock.WithWatchdogTimeout(time.Second))
	n := name(t)
	m := c.ReentrantMutex(n, dlock.WithHandleOwner())
	ctx := ctxTimeout(t, 20*time.Second)

	require.NoError(t, m.Lock(ctx))
	probe := e.rdb()
	var maxTTL, minTTL time.Duration = 0, time.Hour
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		d, err := probe.PTTL(ctx, key(n)).Result()
		require.NoError(t, err)
		require.Positive(t, d, "the lock expired while held")
		maxTTL, minTTL = max(maxTTL, d), min(minTTL, d)
	}
	assert.LessOrEqual(t, maxTTL, time.Second, "TTL never above the watchdog timeout")
	count, err := m.HoldCount(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, count, "still held after 4s")
	select {
	case <-m.Lost(ctx):
		t.Fatal("lost signal while renewals succeed")
	default:
	}
	renewed := renewCalls(cnt)
	assert.GreaterOrEqual(t, renewed, 10, "about 12 renewals in 4s at 1s/3")
	t.Logf("4s hold with a 1s watchdog: %d renewals, TTL seen in [%v, %v]", renewed, minTTL, maxTTL)

	require.NoError(t, m.Unlock(ctx))
	before := renewCalls(cnt)
	time.Sleep(time.Second)
	assert.Equal(t, before, renewCalls(cnt), "no renewals after Unlock")
}

func TestWatchdog_ExplicitLease_ExpiresUnrenewedAndSignalsLoss(t *testing.T) {
	e := realEnv(t)
	cnt := newCounter()
	c := e.client(e.rdb(cnt), dlock.WithWatchdogTimeout(300*time.Millisecond))
	n := name(t)
	m := c.Mutex(n, dlock.WithLease(400*time.Millisecond))
	ctx := ctxTimeout(t, 10*time.Second)
	require.NoError(t, m.Lock(ctx))
	d := within(t, m.Lost(), 2*time.Second, "lost signal at the end of the explicit lease")
	assert.Greater(t, d, 300*time.Millisecond)
	time.Sleep(20 * time.Millisecond)
	exists, err := e.rdb().Exists(ctx, key(n)).Result()
	require.NoError(t, err)
	assert.Zero(t, exists, "explicit lease expired on the server")
	assert.Zero(t, renewCalls(cnt), "an explicit lease is never renewed")
	err = m.Unlock(ctx)
	assert.ErrorIs(t, err, dlock.ErrLost)
}

func TestWatchdog_KeyDeleted_LostSignalWithinOnePeriod(t *testing.T) {
	e := realEnv(t)
	const timeout = 900 * time.Millisecond // renewal period 300ms
	c := e.client(e.rdb(), dlock.WithWatchdogTimeout(timeout))
	n := name(t)
	m := c.Mutex(n)
	ctx := ctxTimeout(t, 10*time.Second)
	require.NoError(t, m.Lock(ctx))
	hctx, stop := m.HoldContext(ctx)
	defer stop()

	require.NoError(t, e.rdb().Del(ctx, key(n)).Err())
	d := within(t, m.Lost(), timeout/3+500*time.Millisecond, "lost signal after the key was deleted")
	t.Logf("lost signal %v after deletion (period %v)", d, timeout/3)
	<-hctx.Done()
	assert.ErrorIs(t, context.Cause(hctx), dlock.ErrLost)
	// The renew script must not re-create the key.
	time.Sleep(timeout / 2)
	exists, err := e.rdb().Exists(ctx, key(n)).Result()
	require.NoError(t, err)
	assert.Zero(t, exists)
	err = m.Unlock(ctx)
	assert.ErrorIs(t, err, dlock.ErrLost)
	assert.ErrorIs(t, err, dlock.ErrNotHeld)
}

func TestWatchdog_RedisUnreachable_LostWhenLeaseMayHaveExpired(t *testing.T) {
	e := realEnv(t)
	const timeout = 600 * time.Millisecond
	c := e.client(e.rdb(), dlock.WithWatchdogTimeout(timeout))
	m := c.Mutex(name(t))
	ctx := ctxTimeout(t, 10*time.Second)
	require.NoError(t, m.Lock(ctx))
	start := time.Now()
	e.srv.Stop() // renewals now fail; the server-side lease can no longer be vouched for
	within(t, m.Lost(), timeout+time.Second, "lost signal with Redis down")
	elapsed := time.Since(start)
	t.Logf("lost signal %v after Redis stopped (timeout %v)", elapsed, timeout)
	// The last good renewal was at most one period before the stop.
	assert.GreaterOrEqual(t, elapsed, timeout-timeout/3-50*time.Millisecond, "not before the lease could have run out")
}

// renewedKeys sums the keys carried by renewal calls.
func renewedKeys(c *counter) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.renewKeys
}

func TestWatchdog_ThousandHolds_EachRenewedOncePerPeriodInBatches(t *testing.T) {
	e := realEnv(t)
	cnt := newCounter()
	const timeout = 1500 * time.Millisecond // period 500ms
	const period = timeout / 3
	c := e.client(e.rdb(cnt), dlock.WithWatchdogTimeout(timeout))
	ctx := ctxTimeout(t, 30*time.Second)
	const holds = 1000
	locks := make([]*dlock.Mutex, holds)
	for i := range locks {
		locks[i] = c.Mutex(fmt.Sprintf("%s-%d", name(t), i))
		require.NoError(t, locks[i].Lock(ctx))
	}
	time.Sleep(period) // the first round loads the script
	cnt.reset()
	const window = 3 * period
	time.Sleep(window)
	trips, _ := cnt.snapshot()
	calls, keys := renewCalls(cnt), renewedKeys(cnt)
	const periods = float64(window / period)
	t.Logf("%d holds over %.0f periods: %d keys renewed in %d script calls, %d round trips", holds, periods, keys, calls, trips)
	// Once a period each, give or take the round at either end of the window.
	assert.InDelta(t, float64(holds), float64(keys)/periods, holds/3.0, "renewals per hold per period")
	// The cost target: at most one round trip per 100 holds per period.
	assert.LessOrEqual(t, float64(trips)/periods, holds/100.0, "round trips per period")
	// Full batches of 100 keys, but for one partial batch per tick of the
	// schedule (4 per period) with leases due.
	assert.LessOrEqual(t, float64(calls)/periods, holds/100.0+5, "script calls per period")
	for _, m := range locks {
		select {
		case <-m.Lost():
			t.Fatal("a hold was lost")
		default:
		}
		require.NoError(t, m.Unlock(ctx))
	}
}

func TestWatchdog_ScriptFlush_RenewalsContinue(t *testing.T) {
	e := realEnv(t)
	c := e.client(e.rdb(), dlock.WithWatchdogTimeout(600*time.Millisecond))
	ms := []*dlock.Mutex{c.Mutex(name(t) + "-a"), c.Mutex(name(t) + "-b")}
	ctx := ctxTimeout(t, 10*time.Second)
	for _, m := range ms {
		require.NoError(t, m.Lock(ctx))
	}
	for range 3 {
		_, err := e.srv.Do(ctx, "script", "flush")
		require.NoError(t, err)
		time.Sleep(300 * time.Millisecond)
	}
	for _, m := range ms {
		select {
		case <-m.Lost():
			t.Fatal("hold lost after SCRIPT FLUSH")
		default:
		}
		require.NoError(t, m.Unlock(ctx), "Unlock after SCRIPT FLUSH")
	}
}

func TestClient_Close_ReportsHoldsLost(t *testing.T) {
	e := sharedEnv(t)
	c := dlock.New(e.rdb())
	m := c.Mutex(name(t))
	ctx := context.Background()
	require.NoError(t, m.Lock(ctx))
	hctx, stop := m.HoldContext(ctx)
	defer stop()
	require.NoError(t, c.Close())
	within(t, m.Lost(), time.Second, "lost signal on Close")
	within(t, hctx.Done(), time.Second, "hold context cancelled on Close")
	assert.ErrorIs(t, context.Cause(hctx), dlock.ErrLost)
	assert.ErrorIs(t, context.Cause(hctx), dlock.ErrClosed)
	assert.ErrorIs(t, m.Unlock(ctx), dlock.ErrClosed)
	assert.ErrorIs(t, m.Lock(ctx), dlock.ErrClosed)
}

// A hold context is cancelled before Lost closes, on the goroutine that
// ends the hold: whoever Lost wakes finds it done, with the loss as its
// cause. Before, it was cancelled one goroutine hop later, so a holder that
// watched Lost and then its context could still find the context live.
// For a Mutex and a MultiLock alike, each lost 20 times at its lease's end.
func TestHoldContext_DoneBeforeLostCloses(t *testing.T) {
	e := sharedEnv(t)
	c := e.client(e.rdb())
	ctx := ctxTimeout(t, 20*time.Second)
	type held interface {
		Lost() <-chan struct{}
		HoldContext(context.Context) (context.Context, context.CancelFunc)
	}
	n := name(t)
	for what, lock := range map[string]func(i int) (held, error){
		"Mutex": func(i int) (held, error) {
			m := c.Mutex(n+"-m-"+strconv.Itoa(i), dlock.WithLease(30*time.Millisecond))
			return m, m.Lock(ctx)
		},
		"MultiLock": func(i int) (held, error) {
			ml := c.MultiLock([]string{n + "-a-" + strconv.Itoa(i), n + "-b-" + strconv.Itoa(i)}, dlock.WithLease(30*time.Millisecond))
			return ml, ml.Lock(ctx)
		},
	} {
		for i := range 20 {
			h, err := lock(i)
			require.NoError(t, err)
			hctx, stop := h.HoldContext(context.Background())
			within(t, h.Lost(), 2*time.Second, what+" Lost")
			select {
			case <-hctx.Done():
			default:
				t.Fatalf("%s, round %d: Lost closed while the hold context was still live", what, i)
			}
			assert.ErrorIs(t, context.Cause(hctx), dlock.ErrLost)
			stop()
		}
	}
}
