package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// masters starts n real redis-servers for a Redlock test.
func masters(t *testing.T, n int) []*redistest.Server {
	t.Helper()
	t.Cleanup(awaitRedials) // registered first: runs after the clients closed
	out := make([]*redistest.Server, n)
	out[0] = redistest.Real(t) // on the test goroutine: it may skip
	var wg sync.WaitGroup
	for i := 1; i < n; i++ {
		wg.Go(func() { out[i] = redistest.Real(t) })
	}
	wg.Wait()
	for _, s := range out {
		if s == nil {
			t.FailNow()
		}
	}
	return out
}

// awaitRedials waits (up to 2s) until no go-redis redial loop is left: a
// pool that failed to dial a stopped master retries every second, and the
// loop outlives the closed pool by up to that long, which goleak would
// report at the end of the package.
func awaitRedials() {
	buf := make([]byte, 1<<20)
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
		if !strings.Contains(string(buf[:runtime.Stack(buf, true)]), "(*ConnPool).tryDial") {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// redlockOn makes a Redlock over the servers at addrs, closed at cleanup.
func redlockOn(t *testing.T, addrs []string, opts ...dlock.Option) *dlock.Redlock {
	t.Helper()
	rdbs := make([]redis.UniversalClient, len(addrs))
	for i, a := range addrs {
		rdb := redis.NewClient(&redis.Options{Addr: a, PoolSize: 32, MaxRetries: -1})
		t.Cleanup(func() { _ = rdb.Close() })
		rdbs[i] = rdb
	}
	r := dlock.NewRedlock(rdbs, opts...)
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// rivalsOn returns handles on one new name from two Redlocks over srvs, each
// with watchdog lease lease: two processes competing for one lock.
func rivalsOn(t *testing.T, srvs []*redistest.Server, lease time.Duration) (ma, mb *dlock.Mutex, n string) {
	t.Helper()
	a := redlockOn(t, addrsOf(srvs), dlock.WithWatchdogTimeout(lease))
	b := redlockOn(t, addrsOf(srvs), dlock.WithWatchdogTimeout(lease))
	n = name(t)
	return a.Mutex(n), b.Mutex(n), n
}

func addrsOf(srvs []*redistest.Server) []string {
	out := make([]string, len(srvs))
	for i, s := range srvs {
		out[i] = s.Addr
	}
	return out
}

// holderOn returns the holder of name's key on srv ("" when none).
func holderOn(t *testing.T, srv *redistest.Server, name string) string {
	t.Helper()
	v, err := srv.Do(context.Background(), "hget", key(name), "o")
	if errors.Is(err, redis.Nil) {
		return ""
	}
	require.NoError(t, err)
	s, _ := v.(string)
	return s
}

// fenceOn returns the fencing counter of name on srv (0 when none).
func fenceOn(t *testing.T, srv *redistest.Server, name string) uint64 {
	t.Helper()
	v, err := srv.Do(context.Background(), "get", key(name)+":rlf")
	if errors.Is(err, redis.Nil) {
		return 0
	}
	require.NoError(t, err)
	n, err := strconv.ParseUint(v.(string), 10, 64)
	require.NoError(t, err)
	return n
}

func TestRedlock_BadInput_ErrInvalidFromEveryCall(t *testing.T) {
	srvs := masters(t, 3)
	cl := func(addr string) redis.UniversalClient {
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		t.Cleanup(func() { _ = rdb.Close() })
		return rdb
	}
	a, b, c := cl(srvs[0].Addr), cl(srvs[1].Addr), cl(srvs[2].Addr)
	_, port, _ := strings.Cut(srvs[0].Addr, ":")
	sameServer := cl("localhost:" + port)
	var nilClient *redis.Client
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{srvs[2].Addr}})
	t.Cleanup(func() { _ = cluster.Close() })
	cases := map[string][]redis.UniversalClient{
		"none":           nil,
		"one":            {a},
		"two":            {a, b},
		"four":           {a, b, c, cl("127.0.0.1:1")},
		"nil interface":  {a, b, nil},
		"nil pointer":    {a, b, nilClient},
		"same client":    {a, b, a},
		"same server":    {a, b, sameServer},
		"cluster client": {a, b, cluster},
	}
	for what, ms := range cases {
		t.Run(what, func(t *testing.T) {
			r := dlock.NewRedlock(ms)
			m := r.Mutex("x")
			ctx := context.Background()
			require.ErrorIs(t, m.Lock(ctx), dlock.ErrInvalid)
			_, err := m.TryLock(ctx)
			require.ErrorIs(t, err, dlock.ErrInvalid)
			require.ErrorIs(t, m.Unlock(ctx), dlock.ErrInvalid)
			require.ErrorIs(t, m.Extend(ctx, time.Second), dlock.ErrInvalid)
			_, err = m.IsLocked(ctx)
			require.ErrorIs(t, err, dlock.ErrInvalid)
			require.Nil(t, m.Lost())
			require.Zero(t, m.Token())
			require.NoError(t, r.Close())
		})
	}
	// A bad option and a bad name, on good masters.
	r := dlock.NewRedlock([]redis.UniversalClient{a, b, c}, dlock.WithWatchdogTimeout(-1))
	require.ErrorIs(t, r.Mutex("x").Lock(context.Background()), dlock.ErrInvalid)
	r = dlock.NewRedlock([]redis.UniversalClient{a, b, c}, dlock.WithSyncReplicas(1, time.Second))
	require.ErrorIs(t, r.Mutex("x").Lock(context.Background()), dlock.ErrInvalid)
	r = dlock.NewRedlock([]redis.UniversalClient{a, b, c})
	defer r.Close()
	require.ErrorIs(t, r.Mutex("").Lock(context.Background()), dlock.ErrInvalid)
	require.ErrorIs(t, r.Mutex("x", dlock.WithLease(-1)).Lock(context.Background()), dlock.ErrInvalid)
	// Nothing reached the servers.
	for _, s := range srvs {
		n, err := s.Do(context.Background(), "dbsize")
		require.NoError(t, err)
		require.EqualValues(t, 0, n)
	}
}

// A quorum grants; the other Redlock is refused; Unlock frees every master
// and the next holder gets a greater token.
func TestRedlock_QuorumGrantsAndUnlockFreesEveryMaster(t *testing.T) {
	srvs := masters(t, 5)
	ma, mb, n := rivalsOn(t, srvs, 2*time.Second)
	ctx := ctxTimeout(t, 10*time.Second)

	require.NoError(t, ma.Lock(ctx))
	t1 := ma.Token()
	require.NotZero(t, t1)
	// Lock returns once a quorum granted; the others follow.
	var holder string
	require.Eventually(t, func() bool {
		holder = holderOn(t, srvs[0], n)
		for _, s := range srvs {
			if h := holderOn(t, s, n); h == "" || h != holder || fenceOn(t, s, n) != t1 {
				return false
			}
		}
		return true
	}, time.Second, 5*time.Millisecond, "every master granted the same ID, with the token")
	ok, err := mb.TryLock(ctx)
	require.NoError(t, err)
	require.False(t, ok)
	for _, s := range srvs {
		require.Equal(t, holder, holderOn(t, s, n), "a refused try leaves the holder's keys")
	}
	locked, err := mb.IsLocked(ctx)
	require.NoError(t, err)
	require.True(t, locked)
	ttl, err := mb.TTL(ctx)
	require.NoError(t, err)
	require.Greater(t, ttl, time.Second)

	require.NoError(t, ma.Unlock(ctx))
	for _, s := range srvs {
		require.Empty(t, holderOn(t, s, n))
	}
	require.ErrorIs(t, ma.Unlock(ctx), dlock.ErrNotHeld)
	ok, err = mb.TryLock(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	require.Greater(t, mb.Token(), t1)
	require.NoError(t, mb.Unlock(ctx))
}

// With two of five masters down a quorum still grants; with three down
// nothing does, and the grants of the two left are given back.
func TestRedlock_MinorityDown_GrantsMajorityDown_GivesBack(t *testing.T) {
	srvs := masters(t, 5)
	r := redlockOn(t, addrsOf(srvs), dlock.WithWatchdogTimeout(time.Second))
	n := name(t)
	m := r.Mutex(n)
	ctx := ctxTimeout(t, 10*time.Second)

	srvs[0].Stop()
	srvs[1].Stop()
	ok, err := m.TryLock(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, m.Unlock(ctx))

	srvs[2].Stop()
	ok, err = m.TryLock(ctx)
	require.False(t, ok)
	require.Error(t, err, "too few masters answered: an error, not a refusal")
	for _, s := range srvs[3:] {
		require.Empty(t, holderOn(t, s, n), "a failed try is given back")
	}
	lctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	err = m.Lock(lctx)
	require.ErrorIs(t, err, dlock.ErrNotObtained)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	// A try cut short by the deadline is given back in the background.
	require.Eventually(t, func() bool {
		return holderOn(t, srvs[3], n) == "" && holderOn(t, srvs[4], n) == ""
	}, time.Second, 10*time.Millisecond)
}

// A blocked Lock is woken by the release message of any master, long
// before the holder's lease would have run out, and even with a master down.
func TestRedlock_WaiterWokenByPubSub(t *testing.T) {
	long(t)
	srvs := masters(t, 5)
	ma, mb, _ := rivalsOn(t, srvs, 20*time.Second)
	ctx := ctxTimeout(t, 10*time.Second)
	srvs[4].Stop()
	for range 3 {
		require.NoError(t, ma.Lock(ctx))
		got := make(chan time.Time, 1)
		go func() {
			if mb.Lock(ctx) == nil {
				got <- time.Now()
			}
			close(got)
		}()
		time.Sleep(150 * time.Millisecond) // b waits
		released := time.Now()
		require.NoError(t, ma.Unlock(ctx))
		at, ok := <-got
		require.True(t, ok, "b got the lock")
		require.Less(t, at.Sub(released), time.Second, "woken by the release, not a timer")
		t.Logf("handoff %v", at.Sub(released))
		require.NoError(t, mb.Unlock(ctx))
	}
}

// WithLease holds are not renewed and are lost when the lease runs out;
// Extend sets a new lease on a quorum; Unlock ends the hold context.
func TestRedlock_WithLeaseExtendHoldContext(t *testing.T) {
	srvs := masters(t, 3)
	r := redlockOn(t, addrsOf(srvs), dlock.WithWatchdogTimeout(600*time.Millisecond))
	n := name(t)
	ctx := ctxTimeout(t, 10*time.Second)

	fixed := r.Mutex(n, dlock.WithLease(400*time.Millisecond))
	start := time.Now() // before the try was sent
	require.NoError(t, fixed.Lock(ctx))
	within(t, fixed.Lost(), 2*time.Second, "Lost of a WithLease hold")
	// Lost at the lease's end less the drift margin (6ms), counted from the
	// send, and not much later (the slack is for a loaded machine).
	took := time.Since(start)
	require.Greater(t, took, 390*time.Millisecond, "lost before its lease ran out")
	require.Less(t, took, 800*time.Millisecond, "lost long after its lease ran out")
	require.ErrorIs(t, fixed.Unlock(ctx), dlock.ErrLost)

	m := r.Mutex(n)
	require.NoError(t, m.Lock(ctx))
	require.NoError(t, m.Extend(ctx, 2*time.Second))
	ttl, err := m.TTL(ctx)
	require.NoError(t, err)
	require.Greater(t, ttl, 1500*time.Millisecond, "Extend set the lease on a quorum")
	hctx, cancel := m.HoldContext(ctx)
	defer cancel()
	require.NoError(t, m.Unlock(ctx))
	within(t, hctx.Done(), time.Second, "hold context ends at Unlock")
	require.NotErrorIs(t, context.Cause(hctx), dlock.ErrLost)
	require.ErrorIs(t, m.Extend(ctx, time.Second), dlock.ErrNotHeld)

	// ForceUnlock frees every master and tells this handle's holder.
	require.NoError(t, m.Lock(ctx))
	released, err := m.ForceUnlock(ctx)
	require.NoError(t, err)
	require.True(t, released)
	within(t, m.Lost(), time.Second, "Lost after ForceUnlock")
	// A master that grants the try after the ForceUnlock (its request was
	// slower than the force) gives it back at once.
	require.Eventually(t, func() bool {
		for _, s := range srvs {
			if holderOn(t, s, n) != "" {
				return false
			}
		}
		return true
	}, time.Second, 10*time.Millisecond)
}

// Close reports open holds lost (ErrClosed), wakes blocked callers with
// ErrClosed, and later calls fail with ErrClosed.
func TestRedlock_Close(t *testing.T) {
	srvs := masters(t, 3)
	a := redlockOn(t, addrsOf(srvs))
	b := redlockOn(t, addrsOf(srvs))
	n := name(t)
	ctx := ctxTimeout(t, 10*time.Second)
	held := b.Mutex(n)
	require.NoError(t, held.Lock(ctx))
	m := a.Mutex(n)
	blocked := make(chan error, 1)
	go func() { blocked <- m.Lock(ctx) }()
	time.Sleep(100 * time.Millisecond)
	require.NoError(t, a.Close())
	require.ErrorIs(t, <-blocked, dlock.ErrClosed)
	require.ErrorIs(t, m.Lock(ctx), dlock.ErrClosed)
	require.NoError(t, b.Close())
	within(t, held.Lost(), time.Second, "Lost at Close")
	hctx, cancel := held.HoldContext(ctx)
	defer cancel()
	within(t, hctx.Done(), time.Second, "hold context ended")
	require.ErrorIs(t, context.Cause(hctx), dlock.ErrClosed)
}

// A key of another program, or another primitive's, at the lock's key on
// every master: Lock and TryLock fail at once with ErrInvalid naming it,
// and write nothing on any master.
func TestRedlock_ForeignKey_RefusedAtOnceNothingWritten(t *testing.T) {
	srvs := masters(t, 3)
	r := redlockOn(t, addrsOf(srvs))
	for _, tc := range []struct {
		what, found string
		put         []any
	}{
		{"string", "string", []any{"set", "", "v"}},
		{"another primitive's hash", "reentrant", []any{"hset", "", "k", "reentrant", "o", "x.1", "n", "1"}},
	} {
		t.Run(tc.what, func(t *testing.T) {
			n := name(t)
			ctx := ctxTimeout(t, 10*time.Second)
			for _, s := range srvs {
				args := slices.Clone(tc.put)
				args[1] = key(n)
				_, err := s.Do(ctx, args...)
				require.NoError(t, err)
			}
			m := r.Mutex(n)
			for _, op := range []func(context.Context) error{
				m.Lock,
				func(ctx context.Context) error { _, err := m.TryLock(ctx); return err },
			} {
				octx, cancel := context.WithTimeout(ctx, 2*time.Second)
				start := time.Now()
				err := op(octx)
				cancel()
				require.ErrorIs(t, err, dlock.ErrInvalid)
				require.Less(t, time.Since(start), 500*time.Millisecond, "not at once")
				require.Contains(t, err.Error(), fmt.Sprintf("%q", key(n)))
				require.Contains(t, err.Error(), tc.found)
			}
			for i, s := range srvs {
				v, err := s.Do(ctx, "exists", key(n)+":rlf")
				require.NoError(t, err)
				require.EqualValues(t, 0, v, "master %d: a fencing counter was written", i)
				typ, err := s.Do(ctx, "type", key(n))
				require.NoError(t, err)
				require.Equal(t, map[string]string{"string": "string", "reentrant": "hash"}[tc.found], typ, "master %d", i)
			}
		})
	}
}

// A Redlock Mutex's Status reads what a quorum of its masters says: the
// holder with its token while held, nobody after Unlock. Before the
// engines were split, it ran the one-Redis status script on a Redlock,
// which has no Redis of its own, and panicked.
func TestRedlock_Status_QuorumHolderAndToken(t *testing.T) {
	srvs := masters(t, 3)
	r := redlockOn(t, addrsOf(srvs))
	ctx := ctxTimeout(t, 10*time.Second)
	m := r.Mutex(name(t))
	st, err := m.Status(ctx)
	require.NoError(t, err)
	require.False(t, st.Held())
	require.NoError(t, m.Lock(ctx))
	st, err = m.Status(ctx)
	require.NoError(t, err)
	require.Len(t, st.Holders, 1)
	assert.Equal(t, dlock.KindMutex, st.Kind)
	assert.Equal(t, m.Token(), st.Token, "the hold's token")
	assert.Positive(t, st.Holders[0].Lease)
	require.NoError(t, m.Unlock(ctx))
	st, err = m.Status(ctx)
	require.NoError(t, err)
	assert.False(t, st.Held(), "held after Unlock: %+v", st)
}
