package dlock_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock"
)

// logBuffer collects what a Client logs.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// count returns how many lines logged contain s.
func (b *logBuffer) count(s string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Count(b.buf.String(), s)
}

func (b *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(b, nil)) }

// semKeys returns every key of the semaphore called n, with its PTTL.
func semKeys(t *testing.T, ctx context.Context, rdb *redis.Client, n string) map[string]time.Duration {
	t.Helper()
	keys, err := rdb.Keys(ctx, key(n)+"*").Result()
	require.NoError(t, err)
	out := map[string]time.Duration{}
	for _, k := range keys {
		ttl, err := rdb.PTTL(ctx, k).Result()
		require.NoError(t, err)
		if ttl != -2*time.Nanosecond { // gone since KEYS
			out[k] = ttl
		}
	}
	return out
}

// expiring fails the test unless every key of n expires within at most d.
func expiring(t *testing.T, ctx context.Context, rdb *redis.Client, n string, d time.Duration, what string) {
	t.Helper()
	for k, ttl := range semKeys(t, ctx, rdb, n) {
		assert.True(t, ttl > 0 && ttl <= d, "%s: %s has PTTL %v, want within (0, %v]", what, k, ttl, d)
	}
}

// goneWithin fails the test unless every key of n is gone within d.
func goneWithin(t *testing.T, ctx context.Context, rdb *redis.Client, n string, d time.Duration, what string) {
	t.Helper()
	start := time.Now()
	for len(semKeys(t, ctx, rdb, n)) > 0 {
		if time.Since(start) > d {
			t.Fatalf("%s: keys left after %v: %v", what, d, semKeys(t, ctx, rdb, n))
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("%s: every key gone %v after", what, time.Since(start).Round(time.Millisecond))
}

// An Acquire on a semaphore whose total was never set waits, but every key
// it writes expires with its waiting mark, kept alive only while it waits;
// the Client warns once per name; the errors say the total was never set;
// and setting the total makes the keys persist and serves the waiter.
func TestSemaphore_AcquireOnUnsetTotal_OnlyExpiringKeysWarnedOnceErrorsSaySo(t *testing.T) {
	e := realEnv(t)
	rdb := e.rdb()
	const timeout = 900 * time.Millisecond
	const mark = timeout / 3
	var logs logBuffer
	c := e.client(e.rdb(), dlock.WithWatchdogTimeout(timeout), dlock.WithLogger(logs.logger()))
	n := name(t)
	s := c.Semaphore(n)
	ctx := ctxTimeout(t, 20*time.Second)

	_, err := s.TryAcquire(ctx, 1)
	assert.ErrorIs(t, err, dlock.ErrNotObtained)
	if assert.Error(t, err) {
		assert.Contains(t, err.Error(), "total was never set")
	}
	assert.Empty(t, semKeys(t, ctx, rdb, n), "TryAcquire wrote")

	// A waiter that outlives several mark leases keeps every key alive, and
	// none of them persists.
	done := make(chan error, 1)
	actx, cancel := context.WithTimeout(ctx, 4*mark)
	defer cancel()
	go func() { _, err := s.Acquire(actx, 2); done <- err }()
	deadline := time.Now().Add(3 * mark)
	for time.Now().Before(deadline) {
		time.Sleep(mark / 4)
		keys := semKeys(t, ctx, rdb, n)
		for _, suffix := range []string{"", ":c", ":q", ":qe"} {
			ttl, ok := keys[key(n)+suffix]
			if assert.True(t, ok, "%s gone while its waiter waits", key(n)+suffix) {
				assert.True(t, ttl > 0 && ttl <= mark, "%s has PTTL %v while the total is unset", key(n)+suffix, ttl)
			}
		}
	}
	err = <-done
	assert.ErrorIs(t, err, dlock.ErrNotObtained)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	if assert.Error(t, err) {
		assert.Contains(t, err.Error(), "total was never set")
		assert.Contains(t, err.Error(), "TrySetPermits")
	}
	expiring(t, ctx, rdb, n, mark, "after the waiter gave up")
	goneWithin(t, ctx, rdb, n, mark+200*time.Millisecond, "after the waiter gave up")

	short, cancelShort := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancelShort()
	_, err = c.Semaphore(n).Acquire(short, 1)
	assert.ErrorIs(t, err, dlock.ErrNotObtained)
	assert.Equal(t, 1, logs.count("never set"), "one warning per name per Client: %s", &logs.buf)
	other := name(t)
	_, err = c.Semaphore(other).Acquire(ctxTimeout(t, 100*time.Millisecond), 1)
	assert.ErrorIs(t, err, dlock.ErrNotObtained)
	assert.Equal(t, 1, logs.count("name="+other), "a warning for another name")

	// Setting the total makes the keys persist and serves the waiter.
	for _, set := range []struct {
		what string
		set  func(s *dlock.Semaphore) error
	}{
		{"TrySetPermits", func(s *dlock.Semaphore) error { return dropOK(s.TrySetPermits(ctx, 2)) }},
		{"AddPermits", func(s *dlock.Semaphore) error { return s.AddPermits(ctx, 2) }},
	} {
		t.Run(set.what, func(t *testing.T) {
			n := name(t)
			got := make(chan *dlock.Permit, 1)
			go func() {
				p, err := c.Semaphore(n).Acquire(ctx, 1)
				assert.NoError(t, err)
				got <- p
			}()
			require.Eventually(t, func() bool { return len(semKeys(t, ctx, rdb, n)) > 0 }, 5*time.Second, time.Millisecond)
			expiring(t, ctx, rdb, n, mark, "queued on an unset total")
			require.NoError(t, set.set(e.client(e.rdb()).Semaphore(n)))
			var p *dlock.Permit
			select {
			case p = <-got:
			case <-time.After(time.Second):
				t.Fatal("the waiter was not served once the total was set")
			}
			time.Sleep(mark + 100*time.Millisecond)
			for k, ttl := range semKeys(t, ctx, rdb, n) {
				assert.Equal(t, time.Duration(-1), ttl, "%s does not persist once the total is set", k)
			}
			total, err := c.Semaphore(n).Total(ctx)
			require.NoError(t, err)
			assert.Equal(t, 2, total)
			require.NoError(t, p.Release(ctx))
		})
	}
	t.Run("with idle expiry", func(t *testing.T) {
		n := name(t)
		go func() { _, _ = c.Semaphore(n).Acquire(ctxTimeout(t, 5*mark), 3) }()
		require.Eventually(t, func() bool { return len(semKeys(t, ctx, rdb, n)) > 0 }, 5*time.Second, time.Millisecond)
		_, err := e.client(e.rdb()).Semaphore(n, dlock.WithIdleExpiry(time.Hour)).TrySetPermits(ctx, 2)
		require.NoError(t, err)
		time.Sleep(mark + 100*time.Millisecond)
		ttl, err := rdb.PTTL(ctx, key(n)).Result()
		require.NoError(t, err)
		assert.Greater(t, ttl, 59*time.Minute, "the main key follows the idle expiry")
	})
}

// A waiter on an unset total whose process dies (cut off from Redis, then
// closed, so that nothing cancels its place) leaves keys that are all gone
// one mark lease after its last renewal.
func TestSemaphore_WaiterOnUnsetTotalDies_ItsKeysGoneAfterTheMarkLease(t *testing.T) {
	e := realEnv(t)
	rdb := e.rdb()
	const timeout = 900 * time.Millisecond
	const mark = timeout / 3
	prdb, proxy := e.proxied()
	c := dlock.New(prdb, dlock.WithWatchdogTimeout(timeout))
	n := name(t)
	ctx := ctxTimeout(t, 20*time.Second)
	done := make(chan error, 1)
	go func() { _, err := c.Semaphore(n).Acquire(ctx, 1); done <- err }()
	require.Eventually(t, func() bool { return len(semKeys(t, ctx, rdb, n)) >= 4 }, 5*time.Second, time.Millisecond)
	time.Sleep(2 * mark) // renewed for a while

	proxy.Partition()
	require.NoError(t, c.Close()) // its cancel cannot reach Redis
	expiring(t, ctx, rdb, n, mark, "after the waiter died")
	goneWithin(t, ctx, rdb, n, mark+200*time.Millisecond, "after the waiter died")
	proxy.Heal()
	assert.ErrorIs(t, <-done, dlock.ErrClosed)
}
