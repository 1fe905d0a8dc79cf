package dlock_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock"
)

// A WithLease hold extended past its lease is kept, on the server and by
// its holder, until the new lease ends, and no longer.
func TestExtend_FixedLease_KeptUntilTheNewLeaseEnds(t *testing.T) {
	e := sharedEnv(t)
	c := e.client(e.rdb())
	other := e.client(e.rdb())
	ctx := ctxTimeout(t, 10*time.Second)
	n := name(t)
	m := c.Mutex(n, dlock.WithLease(300*time.Millisecond))
	require.NoError(t, m.Lock(ctx))
	token := m.Token()
	extended := time.Now()
	require.NoError(t, m.Extend(ctx, 1200*time.Millisecond))
	assert.Equal(t, token, m.Token(), "Extend keeps the token")

	time.Sleep(600 * time.Millisecond) // past the first lease
	ok, err := other.Mutex(n).TryLock(ctx)
	require.NoError(t, err)
	assert.False(t, ok, "another Client took the lock inside the extended lease")
	select {
	case <-m.Lost():
		t.Fatal("Lost fired inside the extended lease")
	default:
	}

	within(t, m.Lost(), 2*time.Second, "Lost at the end of the extended lease")
	lostAfter := time.Since(extended)
	assert.Greater(t, lostAfter, 1150*time.Millisecond)
	assert.Less(t, lostAfter, 1500*time.Millisecond)
	require.Eventually(t, func() bool {
		ok, err := other.Mutex(n).TryLock(ctx)
		return err == nil && ok
	}, time.Second, 5*time.Millisecond, "the key outlived the extended lease")
	t.Logf("extended to 1.2s: Lost after %v", lostAfter.Round(time.Millisecond))
	assert.ErrorIs(t, m.Unlock(ctx), dlock.ErrLost)
}

// Extend on a hold the watchdog renews sets its end: renewals stop, and
// the holder is told before another Client holds the lock.
func TestExtend_WatchdogHold_RenewalsStopAndTheHolderLearnsFirst(t *testing.T) {
	e := sharedEnv(t)
	c := e.client(e.rdb(), dlock.WithWatchdogTimeout(3*time.Second))
	other := e.client(e.rdb())
	ctx := ctxTimeout(t, 10*time.Second)
	n := name(t)
	m := c.Mutex(n)
	require.NoError(t, m.Lock(ctx))
	hctx, stop := m.HoldContext(ctx)
	defer stop()
	knew := endedAt(hctx)
	require.NoError(t, m.Extend(ctx, 400*time.Millisecond))
	d, err := e.rdb().PTTL(ctx, key(n)).Result()
	require.NoError(t, err)
	assert.LessOrEqual(t, d, 400*time.Millisecond, "a shorter lease applies at once")

	om := other.Mutex(n)
	held := lockAt(t, ctx, om)
	otherHeld := <-held
	require.False(t, knew().IsZero(), "the holder was never told")
	assert.True(t, knew().Before(otherHeld), "the holder learned of its end only after another Client held the lock")
	assert.ErrorIs(t, context.Cause(hctx), dlock.ErrLost)
	require.NoError(t, om.Unlock(ctx))
}

// Renewals in flight when Extend is called never land after it. A hook
// holds each of the watchdog's renewals back for 50ms after it was sent
// (of a 100ms renewal period), as a slow connection would, so that many
// Extends are sent while a renewal is on its way; a 5s Extend must never be
// set back to the watchdog's 300ms.
func TestExtend_RacingRenewals_NeverUndoTheNewLease(t *testing.T) {
	long(t)
	e := sharedEnv(t)
	const timeout = 300 * time.Millisecond
	c := e.client(e.rdb(&slowRenewals{ttl: timeout.Milliseconds(), delay: 50 * time.Millisecond}), dlock.WithWatchdogTimeout(timeout))
	ctx := ctxTimeout(t, 30*time.Second)
	probe := e.rdb()
	for i := range 10 {
		m := c.Mutex(name(t))
		require.NoError(t, m.Lock(ctx))
		// Land the Extend at a different point of the renewal cycle each time.
		time.Sleep(100*time.Millisecond + time.Duration(i)*11*time.Millisecond)
		require.NoError(t, m.Extend(ctx, 5*time.Second))
		time.Sleep(400 * time.Millisecond) // longer than the watchdog's lease
		d, err := probe.PTTL(ctx, key(m.Name())).Result()
		require.NoError(t, err)
		assert.Greater(t, d, 4*time.Second, "round %d: a renewal set the lease back", i)
		require.NoError(t, m.Unlock(ctx))
	}
}

// slowRenewals delays, before sending, every pipeline that carries a
// renewal script call with the given lease (the watchdog's, not Extend's).
type slowRenewals struct {
	ttl   int64
	delay time.Duration
}

func (h *slowRenewals) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *slowRenewals) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h *slowRenewals) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			args := cmd.Args()
			if len(args) < 4 || (cmd.Name() != "evalsha" && cmd.Name() != "eval") {
				continue
			}
			nkeys, _ := strconv.Atoi(fmt.Sprint(args[2]))
			if 3+nkeys < len(args) && fmt.Sprint(args[3+nkeys]) == strconv.FormatInt(h.ttl, 10) {
				time.Sleep(h.delay)
				break
			}
		}
		return next(ctx, cmds)
	}
}

func TestExtend_BadCalls_ClearErrorsNothingChanged(t *testing.T) {
	e := sharedEnv(t)
	c := e.client(e.rdb())
	ctx := ctxTimeout(t, 10*time.Second)
	m := c.Mutex(name(t))
	assert.ErrorIs(t, m.Extend(ctx, time.Second), dlock.ErrNotHeld)

	require.NoError(t, m.Lock(ctx))
	before, err := e.rdb().PTTL(ctx, key(m.Name())).Result()
	require.NoError(t, err)
	assert.ErrorIs(t, m.Extend(ctx, 0), dlock.ErrInvalid)
	assert.ErrorIs(t, m.Extend(ctx, -time.Second), dlock.ErrInvalid)
	after, err := e.rdb().PTTL(ctx, key(m.Name())).Result()
	require.NoError(t, err)
	assert.InDelta(t, before.Milliseconds(), after.Milliseconds(), 200, "a bad Extend changed the lease")

	// Another Client forces the lock open: the holder's Extend finds it gone.
	_, err = e.client(e.rdb()).Mutex(m.Name()).ForceUnlock(ctx)
	require.NoError(t, err)
	err = m.Extend(ctx, time.Second)
	assert.ErrorIs(t, err, dlock.ErrLost)
	within(t, m.Lost(), time.Second, "Lost after Extend found the hold gone")
	assert.Equal(t, 1, strings.Count(err.Error(), "dlock:"), "one prefix: %v", err)

	require.NoError(t, c.Mutex(m.Name()).Lock(ctx)) // still free for others
}

// ReentrantMutex, RWMutex (both sides) and Permit extend their own leases.
func TestExtend_EveryHoldKind_SetsItsOwnLease(t *testing.T) {
	e := sharedEnv(t)
	c := e.client(e.rdb())
	ctx := ctxTimeout(t, 10*time.Second)
	probe := e.rdb()
	zscoreLeft := func(k, member string) time.Duration {
		now, err := probe.Time(ctx).Result()
		require.NoError(t, err)
		s, err := probe.ZScore(ctx, k, member).Result()
		require.NoError(t, err)
		return time.UnixMilli(int64(s)).Sub(now)
	}

	octx := dlock.WithOwner(ctx, "job-1")
	r := c.ReentrantMutex(name(t), dlock.WithHandleOwner())
	require.NoError(t, r.Lock(octx))
	require.NoError(t, r.Lock(octx))
	require.NoError(t, r.Extend(octx, 90*time.Second))
	d, _ := probe.PTTL(ctx, key(r.Name())).Result()
	assert.Greater(t, d, 80*time.Second, "reentrant hold not extended")
	assert.ErrorIs(t, r.Extend(dlock.WithOwner(ctx, "job-2"), time.Second), dlock.ErrNotHeld)

	rw := c.RWMutex(name(t), dlock.WithHandleOwner())
	require.NoError(t, rw.Lock(octx))
	require.NoError(t, rw.Extend(octx, 90*time.Second))
	d, _ = probe.PTTL(ctx, key(rw.Name())).Result()
	assert.Greater(t, d, 80*time.Second, "write hold not extended")
	require.NoError(t, rw.Unlock(octx))
	require.NoError(t, rw.RLock(octx))
	require.NoError(t, rw.RExtend(octx, 90*time.Second))
	members, err := probe.ZRange(ctx, key(rw.Name())+":rl", 0, -1).Result()
	require.NoError(t, err)
	require.Len(t, members, 1)
	assert.Greater(t, zscoreLeft(key(rw.Name())+":rl", members[0]), 80*time.Second, "read hold not extended")

	s := c.Semaphore(name(t))
	require.NoError(t, s.SetPermits(ctx, 2))
	p, err := s.Acquire(ctx, 1)
	require.NoError(t, err)
	require.NoError(t, p.Extend(ctx, 90*time.Second))
	members, err = probe.ZRange(ctx, key(s.Name())+":h", 0, -1).Result()
	require.NoError(t, err)
	require.Len(t, members, 1)
	assert.Greater(t, zscoreLeft(key(s.Name())+":h", members[0]), 80*time.Second, "permit not extended")
	require.NoError(t, p.Release(ctx))
	assert.ErrorIs(t, p.Extend(ctx, time.Second), dlock.ErrNotHeld)
}
