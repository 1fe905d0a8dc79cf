package dlock_test

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock"
)

// A nil context, a glob Redis would match nothing to, and an election value
// Leader could not tell from none are refused with ErrInvalid, not a panic
// or a silent nothing (issue 23, item 11).
func TestBadInput_NilContextBadGlobEmptyValue_ErrInvalid(t *testing.T) {
	e := sharedEnv(t)
	c := e.client(e.rdb())
	var nilCtx context.Context
	s := c.Semaphore(name(t))
	calls := map[string]func() error{
		"Mutex.Lock":      func() error { return c.Mutex("n").Lock(nilCtx) },
		"Mutex.TryLock":   func() error { _, err := c.Mutex("n").TryLock(nilCtx); return err },
		"Mutex.Unlock":    func() error { return c.Mutex("n").Unlock(nilCtx) },
		"Mutex.IsLocked":  func() error { _, err := c.Mutex("n").IsLocked(nilCtx); return err },
		"Reentrant.Lock":  func() error { return c.ReentrantMutex("n", dlock.WithHandleOwner()).Lock(nilCtx) },
		"RWMutex.RLock":   func() error { return c.RWMutex("n", dlock.WithHandleOwner()).RLock(nilCtx) },
		"Semaphore.Acq":   func() error { _, err := s.Acquire(nilCtx, 1); return err },
		"Semaphore.Set":   func() error { _, err := s.TrySetPermits(nilCtx, 1); return err },
		"Latch.Await":     func() error { return c.CountDownLatch("n").Await(nilCtx) },
		"Election.Leader": func() error { _, err := c.Election("n").Leader(nilCtx); return err },
		"Client.Status":   func() error { _, err := c.Status(nilCtx, "n"); return err },
		"Client.List":     func() error { _, err := c.List(nilCtx, "*"); return err },
		"List unclosed [": func() error { _, err := c.List(context.Background(), "["); return err },
		"List trailing \\": func() error {
			_, err := c.List(context.Background(), `a\`)
			return err
		},
		"Campaign with an empty value": func() error { return c.Election(name(t)).Campaign(context.Background(), "") },
	}
	for what, call := range calls {
		var err error
		require.NotPanics(t, func() { err = call() }, what)
		assert.ErrorIs(t, err, dlock.ErrInvalid, what)
	}
	got, err := c.List(context.Background(), `x[ab]\*`)
	require.NoError(t, err, "a well-formed glob")
	assert.Empty(t, got)
}

// Error texts quote a name in at most 128 bytes, and name the operation
// that failed (issue 23, item 7).
func TestErrors_CappedNamesAndTheRightOperation(t *testing.T) {
	e := sharedEnv(t)
	c := e.client(e.rdb())
	ctx := ctxTimeout(t, 10*time.Second)
	huge := strings.Repeat("n", 64<<20)
	err := c.Mutex(huge).Lock(ctx)
	require.ErrorIs(t, err, dlock.ErrInvalid)
	assert.Less(t, len(err.Error()), 400, "an error about a 64 MiB name")
	long := strings.Repeat("n", dlock.MaxNameLength)
	err = c.Mutex(long).Unlock(ctx)
	require.ErrorIs(t, err, dlock.ErrNotHeld)
	assert.Less(t, len(err.Error()), 300, "an error quoting a 1024-byte name")
	assert.Contains(t, err.Error(), "…(1024 bytes)")

	_, err = c.ForceUnlock(ctx, "nope-"+name(t))
	require.ErrorIs(t, err, dlock.ErrNotFound)
	assert.True(t, strings.HasPrefix(err.Error(), "dlock: forceunlock "), "%v", err)

	el := c.Election(name(t))
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	err = el.Campaign(cctx, "v")
	require.ErrorIs(t, err, dlock.ErrNotObtained)
	assert.True(t, strings.HasPrefix(err.Error(), "dlock: campaign "), "%v", err)
	err = el.Resign(ctx)
	require.ErrorIs(t, err, dlock.ErrNotHeld)
	assert.True(t, strings.HasPrefix(err.Error(), "dlock: resign "), "%v", err)
}

// A span's exception event names the dlock error a caller can match
// (dlock.ErrLost), not the unexported type that carries it (issue 23,
// item 7).
func TestTelemetry_ExceptionTypeIsTheSentinel(t *testing.T) {
	o := newOtel(t)
	e := realEnv(t)
	rdb, proxy := e.proxied()
	c := e.client(rdb, o.opts(dlock.WithWatchdogTimeout(300*time.Millisecond))...)
	ctx := ctxTimeout(t, 10*time.Second)
	m := c.Mutex(name(t))
	require.NoError(t, m.Lock(ctx))
	proxy.Partition()
	within(t, m.Lost(), time.Second, "Lost")
	require.ErrorIs(t, m.Unlock(ctx), dlock.ErrLost)
	proxy.Heal()
	spans := o.ended("dlock.Mutex.Unlock")
	require.Len(t, spans, 1)
	var types []string
	for _, ev := range spans[0].Events() {
		if ev.Name != "exception" {
			continue
		}
		for _, kv := range ev.Attributes {
			if kv.Key == "exception.type" {
				types = append(types, kv.Value.AsString())
			}
		}
	}
	assert.Equal(t, []string{"dlock.ErrLost"}, types)
}

// lockedBuffer is a log destination that tests read while dlock writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// With Redis down, every call fails with an error matching ErrUnavailable,
// each within go-redis's own retries (not after dlock's clean-ups, which a
// request never sent does not need), and dlock logs the outage once, and
// once that Redis answers again (issue 23, item 4: 3.2 s a Lock, 35 log
// lines, and an error matching no dlock sentinel).
func TestUnavailable_RedisDown_ErrUnavailableLoggedOnce(t *testing.T) {
	long(t)
	e := realEnv(t)
	var logs lockedBuffer
	c := e.client(e.rdb(), dlock.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	e.srv.Stop() // connections refused from here on
	for what, call := range map[string]func(ctx context.Context) error{
		"Lock":      func(ctx context.Context) error { return c.Mutex("n").Lock(ctx) },
		"Acquire":   func(ctx context.Context) error { _, err := c.Semaphore("n").Acquire(ctx, 1); return err },
		"IsLocked":  func(ctx context.Context) error { _, err := c.Mutex("n").IsLocked(ctx); return err },
		"CountDown": func(ctx context.Context) error { return c.CountDownLatch("n").CountDown(ctx) },
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		start := time.Now()
		err := call(ctx)
		cancel()
		assert.ErrorIs(t, err, dlock.ErrUnavailable, what)
		assert.Less(t, time.Since(start), 5*time.Second, "%s took go-redis's retries and more", what)
	}
	assert.Equal(t, 1, strings.Count(logs.String(), "could not be reached"), "the outage logged once:\n%s", logs.String())
	assert.NotContains(t, logs.String(), "Redis answers again")

	require.NoError(t, e.srv.RestartProcess())
	m := c.Mutex(name(t))
	require.Eventually(t, func() bool { return m.Lock(context.Background()) == nil }, 10*time.Second, 100*time.Millisecond)
	require.NoError(t, m.Unlock(context.Background()))
	assert.Equal(t, 1, strings.Count(logs.String(), "Redis answers again"), "the end of the outage logged once:\n%s", logs.String())
}

// dials counts the connections a go-redis client opens.
type dials struct{ n atomic.Int64 }

func (d *dials) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		d.n.Add(1)
		return next(ctx, network, addr)
	}
}
func (d *dials) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (d *dials) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// The first Lock of a new Client costs two cold round trips plus script
// loading (DESIGN.md): its connection's handshake and the try; on a server
// that does not have the script yet (its first Client, or after a restart
// or SCRIPT FLUSH), the try's EVALSHA is refused and an EVAL follows.
// Nothing else is on its way: no probe of the server, no loading of every
// script up front. Beside it, in the background, the first hold warms
// WarmConns connections for renewals, one PING each (lease.Renewals'
// Prepare), which the test waits for and then counts out.
func TestClient_FirstLock_OneConnection_OneTry_PlusScriptLoading(t *testing.T) {
	e := realEnv(t) // a server of its own: no script loaded yet
	ctx := ctxTimeout(t, 10*time.Second)
	for _, tc := range []struct {
		name  string
		trips int
		sent  string
	}{{"script not loaded", 2, "eval"}, {"script loaded", 1, "evalsha"}} {
		t.Run(tc.name, func(t *testing.T) {
			cnt, d := newCounter(), &dials{}
			rdb := e.rdb(cnt)
			rdb.AddHook(d)
			c := e.client(rdb)
			m := c.Mutex(name(t))
			require.NoError(t, m.Lock(ctx))
			warmedUp(t, cnt)
			trips, cmds := cnt.snapshot()
			assert.Equal(t, dlock.WarmConns, cmds["ping"], "PINGs besides the warm-up's: %v", cmds)
			assert.Equal(t, tc.trips, trips-dlock.WarmConns, "round trips besides the handshake and the warm-up: %v", cmds)
			assert.Equal(t, 1, cmds[tc.sent], "%v", cmds)
			assert.LessOrEqual(t, d.n.Load(), int64(1+dlock.WarmConns), "connections opened")
			require.NoError(t, m.Unlock(ctx))
		})
	}
}
