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

// tokenLog records the tokens seen under a lock, in acquisition order.
type tokenLog struct {
	mu     sync.Mutex
	tokens []uint64
}

func (l *tokenLog) add(t uint64) {
	l.mu.Lock()
	l.tokens = append(l.tokens, t)
	l.mu.Unlock()
}

// assertIncreasing checks that every token is non-zero and greater than the
// one before it, and returns how many order violations it found.
func (l *tokenLog) assertIncreasing(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	violations := 0
	for i, tok := range l.tokens {
		if tok == 0 || i > 0 && tok <= l.tokens[i-1] {
			violations++
		}
	}
	t.Logf("tokens checked: %d, order violations: %d", len(l.tokens), violations)
	assert.Zero(t, violations, "tokens must be non-zero and strictly increasing in acquisition order")
}

func TestToken_ThreeClientsEightGoroutines_StrictlyIncreasing(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 30*time.Second)
	var log tokenLog
	var wg sync.WaitGroup
	for range 3 {
		c := e.client(e.rdb())
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				m := c.Mutex(n)
				for range 10 {
					if !assert.NoError(t, m.Lock(ctx)) {
						return
					}
					log.add(m.Token()) // recorded under the lock: acquisition order
					assert.NoError(t, m.Unlock(ctx))
				}
			}()
		}
	}
	wg.Wait()
	require.Len(t, log.tokens, 240)
	log.assertIncreasing(t)
}

func TestToken_AcrossExpiryForceUnlockHandoffAndRestart(t *testing.T) {
	e := realEnv(t) // leases run out; the server restarts
	ctx := ctxTimeout(t, 30*time.Second)
	n := name(t)
	c := e.client(e.rdb())
	var log tokenLog

	// Lease expiry: the next holder's token follows the expired one's.
	m := c.Mutex(n, dlock.WithLease(100*time.Millisecond))
	require.NoError(t, m.Lock(ctx))
	log.add(m.Token())
	within(t, m.Lost(), 2*time.Second, "the lease running out")
	time.Sleep(20 * time.Millisecond)
	m2 := c.Mutex(n)
	require.NoError(t, m2.Lock(ctx))
	log.add(m2.Token())

	// ForceUnlock, then a new holder.
	released, err := c.Mutex(n).ForceUnlock(ctx)
	require.NoError(t, err)
	require.True(t, released)
	m3 := e.client(e.rdb()).Mutex(n)
	require.NoError(t, m3.Lock(ctx))
	log.add(m3.Token())

	// Hand-over to a waiter on another Client: its token comes in the
	// hand-over message.
	waiter := e.client(e.rdb()).Mutex(n)
	done := queueUp(t, ctx, e.rdb(), n, waiter, 1)
	require.NoError(t, m3.Unlock(ctx))
	within(t, done, 5*time.Second, "the hand-over")
	log.add(waiter.Token())
	require.NoError(t, waiter.Unlock(ctx))

	// A restart without persistence loses every key, the last token too.
	e.srv.Restart(t)
	m4 := e.client(e.rdb()).Mutex(n)
	require.NoError(t, m4.Lock(ctx))
	log.add(m4.Token())
	require.NoError(t, m4.Unlock(ctx))
	log.assertIncreasing(t)
}

func TestToken_ReentryKeepsTheOwnersToken(t *testing.T) {
	e := sharedEnv(t)
	ctx := dlock.WithNewOwner(ctxTimeout(t, 10*time.Second))
	c := e.client(e.rdb())
	r := c.ReentrantMutex(name(t), dlock.WithHandleOwner())
	assert.Zero(t, r.Token(ctx), "no hold, no token")
	require.NoError(t, r.Lock(ctx))
	first := r.Token(ctx)
	require.NotZero(t, first)
	require.NoError(t, r.Lock(ctx))
	assert.Equal(t, first, r.Token(ctx), "re-entry keeps the token")
	assert.Zero(t, r.Token(dlock.WithNewOwner(ctx)), "another owner holds nothing")
	require.NoError(t, r.Unlock(ctx))
	require.NoError(t, r.Unlock(ctx))
	assert.Zero(t, r.Token(ctx))
	require.NoError(t, r.Lock(ctx))
	assert.Greater(t, r.Token(ctx), first, "a new hold gets a new token")
	require.NoError(t, r.Unlock(ctx))
}

func TestToken_RWMutexWritesAndPermits(t *testing.T) {
	e := sharedEnv(t)
	ctx := dlock.WithNewOwner(ctxTimeout(t, 10*time.Second))
	c := e.client(e.rdb())
	rw := c.RWMutex(name(t), dlock.WithHandleOwner())
	var writes tokenLog
	for range 3 {
		require.NoError(t, rw.Lock(ctx))
		writes.add(rw.Token(ctx))
		require.NoError(t, rw.RLock(ctx)) // downgrade: a read hold has no token of its own
		require.NoError(t, rw.Unlock(ctx))
		assert.Zero(t, rw.Token(ctx), "only a write hold has a token")
		require.NoError(t, rw.RUnlock(ctx))
	}
	writes.assertIncreasing(t)

	s := c.Semaphore(name(t))
	_, err := s.TrySetPermits(ctx, 2)
	require.NoError(t, err)
	var permits tokenLog
	for range 4 {
		p, err := s.Acquire(ctx, 1)
		require.NoError(t, err)
		permits.add(p.Token())
		require.NoError(t, p.Release(ctx))
	}
	permits.assertIncreasing(t)
}

// Tokens follow the server's clock in microseconds, so a token is at least
// the server's time at the grant: that is what keeps them increasing when
// Redis loses its data.
func TestToken_FollowsTheServerClock(t *testing.T) {
	e := sharedEnv(t)
	ctx := context.Background()
	rdb := e.rdb()
	before, err := rdb.Time(ctx).Result()
	require.NoError(t, err)
	m := e.client(rdb).Mutex(name(t))
	require.NoError(t, m.Lock(ctx))
	defer func() { require.NoError(t, m.Unlock(ctx)) }()
	after, err := rdb.Time(ctx).Result()
	require.NoError(t, err)
	tok := int64(m.Token())
	assert.GreaterOrEqual(t, tok, before.UnixMicro())
	assert.LessOrEqual(t, tok, after.UnixMicro()+1)
}

// The uncontended acquire (excl_try's hot path) compares the stored token,
// any reservation and the clock: a stored token with fewer digits than the
// clock, one ahead of the clock, and a reservation ahead of both.
func TestToken_HotPath_TheGreaterOfClockAndStoredPlusOne(t *testing.T) {
	e := sharedEnv(t)
	ctx := ctxTimeout(t, 10*time.Second)
	rdb := e.rdb()
	n := name(t)
	c := e.client(rdb)
	m := c.Mutex(n, dlock.WithoutCohort()) // reserves nothing
	require.NoError(t, m.Lock(ctx))        // the key exists from here on: later Locks take the hot path
	require.NoError(t, m.Unlock(ctx))
	lockWith := func(fields ...any) uint64 {
		t.Helper()
		if len(fields) > 0 {
			require.NoError(t, rdb.HSet(ctx, key(n), fields...).Err())
		}
		require.NoError(t, m.Lock(ctx))
		defer func() { require.NoError(t, m.Unlock(ctx)) }()
		return m.Token()
	}

	before, err := rdb.Time(ctx).Result()
	require.NoError(t, err)
	tok := lockWith("f", "5")
	after, err := rdb.Time(ctx).Result()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, int64(tok), before.UnixMicro(), "a short stored token: the clock")
	assert.LessOrEqual(t, int64(tok), after.UnixMicro()+1)

	assert.Equal(t, uint64(8000000000000001), lockWith("f", "8000000000000000"), "a stored token ahead of the clock, plus one")
	assert.Equal(t, uint64(8000000000000101), lockWith("f", "8000000000000000", "x", "100"), "a reservation of 100 after the stored token, plus one")
	assert.Equal(t, uint64(8000000000000202), lockWith("x", "100"), "a reservation ahead of the clock, plus one")
	require.NoError(t, rdb.HDel(ctx, key(n), "x").Err())
	assert.Equal(t, uint64(8000000000000203), lockWith("r", "9000000000000000"), "field r of older versions is not read")

	// A cohorting Mutex reserves its bound's worth after its own token.
	co := c.Mutex(n)
	require.NoError(t, co.Lock(ctx))
	assert.Equal(t, uint64(8000000000000204), co.Token())
	require.NoError(t, co.Unlock(ctx))
	assert.Equal(t, uint64(8000000000000204+dlock.DefaultCohortHandoffs+1), lockWith(), "the next token follows the reservation")
}

// A holder that crashes leaves the lock's key to expire with its lease,
// token and all. The next token must still be above the crashed holder's,
// also when the server's clock is behind that token, as after the clock
// stepped back: the token memory every lock kind shares (p{n}:f, kept for
// a minute after each grant) outlives the key. Here the name's last token
// is set an hour ahead of the clock before the crashed holder takes it, so
// that its token is ahead of the clock, as it is after a step back.
func TestToken_CrashedHolderWithClockBehind_NextTokenStillAbove(t *testing.T) {
	long(t)
	type locker struct {
		name string
		// lock takes the lock on c and returns its token and its release.
		lock func(t *testing.T, ctx context.Context, c *dlock.Client, n string) (uint64, func() error)
	}
	mutex := func(opts ...dlock.LockOption) func(*testing.T, context.Context, *dlock.Client, string) (uint64, func() error) {
		return func(t *testing.T, ctx context.Context, c *dlock.Client, n string) (uint64, func() error) {
			m := c.Mutex(n, opts...)
			require.NoError(t, m.Lock(ctx))
			return m.Token(), func() error { return m.Unlock(ctx) }
		}
	}
	lockers := []locker{
		{"mutex", mutex(dlock.WithoutCohort())},
		{"cohorting mutex", mutex()},
		{"reentrant", func(t *testing.T, ctx context.Context, c *dlock.Client, n string) (uint64, func() error) {
			m := c.ReentrantMutex(n, dlock.WithHandleOwner())
			require.NoError(t, m.Lock(ctx))
			return m.Token(ctx), func() error { return m.Unlock(ctx) }
		}},
		{"rwmutex writer", func(t *testing.T, ctx context.Context, c *dlock.Client, n string) (uint64, func() error) {
			rw := c.RWMutex(n, dlock.WithHandleOwner())
			require.NoError(t, rw.Lock(ctx))
			return rw.Token(ctx), func() error { return rw.Unlock(ctx) }
		}},
		{"election", func(t *testing.T, ctx context.Context, c *dlock.Client, n string) (uint64, func() error) {
			e := c.Election(n)
			require.NoError(t, e.Campaign(ctx, "v"))
			return e.Token(), func() error { return e.Resign(ctx) }
		}},
	}
	e := realEnv(t) // miniredis's clock is not the point here
	rdb := e.rdb()
	c0 := e.client(rdb)
	for _, crashed := range lockers {
		for _, next := range lockers {
			t.Run(crashed.name+" then "+next.name, func(t *testing.T) {
				ctx := ctxTimeout(t, 10*time.Second)
				n := name(t)
				// The name's last token, an hour ahead of the clock.
				_, unlock := crashed.lock(t, ctx, c0, n)
				require.NoError(t, unlock())
				now, err := rdb.Time(ctx).Result()
				require.NoError(t, err)
				ahead := uint64(now.Add(time.Hour).UnixMicro())
				require.NoError(t, rdb.HSet(ctx, key(n), "f", ahead).Err())

				c1 := dlock.New(rdb, dlock.WithWatchdogTimeout(300*time.Millisecond))
				t1, _ := crashed.lock(t, ctx, c1, n)
				require.Greater(t, t1, ahead, "the crashed holder's token follows the last one")
				require.NoError(t, c1.Close()) // crashes: no release, the key expires with the lease
				require.Eventually(t, func() bool { return rdb.Exists(ctx, key(n)).Val() == 0 }, 3*time.Second, 10*time.Millisecond)

				t2, unlock := next.lock(t, ctx, c0, n)
				defer func() { require.NoError(t, unlock()) }()
				above := t1
				if crashed.name == "cohorting mutex" {
					above += dlock.DefaultCohortHandoffs // the tokens its grant reserved
				}
				assert.Greater(t, t2, above, "token after a crashed holder's")
			})
		}
	}
}
