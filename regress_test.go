package dlock_test

// Regression tests for defects found in review of the core.

import (
	"context"
	"crypto/sha1"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/scripts"
)

// replyLost is a go-redis hook that lets matching commands run on the server
// and then reports a transport error, as when a connection breaks before the
// reply arrives.
type replyLost struct {
	match func(cmd redis.Cmder) bool
}

func (h *replyLost) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *replyLost) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *replyLost) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err == nil && h.match(cmd) {
			err = &net.OpError{Op: "read", Net: "tcp", Err: errors.New("i/o timeout (injected)")}
			cmd.SetErr(err)
		}
		return err
	}
}

// isScript reports whether cmd runs s, by EVALSHA or by EVAL of its source.
func isScript(cmd redis.Cmder, s *redis.Script) bool {
	args := cmd.Args()
	if len(args) < 2 {
		return false
	}
	switch strings.ToLower(cmd.Name()) {
	case "evalsha":
		return args[1] == s.Hash()
	case "eval":
		src, _ := args[1].(string)
		return fmt.Sprintf("%x", sha1.Sum([]byte(src))) == s.Hash()
	}
	return false
}

func TestMutex_ReplyLostOnAcquire_LeavesNoHold(t *testing.T) {
	e := sharedEnv(t)
	rdb := e.rdb(&replyLost{match: func(cmd redis.Cmder) bool { return isScript(cmd, scripts.ExclTry) }})
	n := name(t)
	m := e.client(rdb).Mutex(n)
	ctx := context.Background()
	require.Error(t, m.Lock(ctx))
	assert.Empty(t, holderOf(t, e.rdb(), n), "a Lock that failed in transit must not leave its hold for the lease")
}

func TestReentrantMutex_ReplyLostOnNestedLock_CountStaysRight(t *testing.T) {
	e := sharedEnv(t)
	var fail flag
	rdb := e.rdb(&replyLost{match: func(cmd redis.Cmder) bool { return fail.get() && isScript(cmd, scripts.ExclTry) }})
	n := name(t)
	r := e.client(rdb).ReentrantMutex(n, dlock.WithHandleOwner())
	ctx := context.Background()
	require.NoError(t, r.Lock(ctx))
	fail.set(true)
	require.Error(t, r.Lock(ctx), "nested Lock whose reply was lost")
	fail.set(false)
	count, err := r.HoldCount(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, count, "the lost nested hold was given back")
	require.NoError(t, r.Unlock(ctx))
	assert.Empty(t, holderOf(t, e.rdb(), n), "the outer Unlock releases the lock")
}

func TestReentrantMutex_KeyVanishedThenOwnerLocksAgain_OldHoldReportedLost(t *testing.T) {
	e := sharedEnv(t)
	rdb := e.rdb()
	n := name(t)
	r := e.client(rdb).ReentrantMutex(n, dlock.WithHandleOwner())
	ctx := dlock.WithOwner(context.Background(), "o")
	require.NoError(t, r.Lock(ctx))
	lost := r.Lost(ctx)
	hctx, done := r.HoldContext(ctx)
	defer done()
	require.NoError(t, rdb.Del(ctx, key(n)).Err()) // as a ForceUnlock elsewhere, or a failover, would
	require.NoError(t, r.Lock(ctx))                // the server counts 1: a new hold
	within(t, lost, time.Second, "the old hold's lost signal")
	within(t, hctx.Done(), time.Second, "the old hold context")
	assert.ErrorIs(t, context.Cause(hctx), dlock.ErrLost)
	assert.NotNil(t, r.Lost(ctx))
	assert.NotEqual(t, lost, r.Lost(ctx), "the new hold has its own signal")
	require.NoError(t, r.Unlock(ctx))
}

func TestReentrantMutex_SameOwnerConcurrently_CountsAndErrorsExact(t *testing.T) {
	e := sharedEnv(t)
	r := e.client(e.rdb()).ReentrantMutex(name(t), dlock.WithHandleOwner())
	ctx := dlock.WithOwner(context.Background(), "shared-owner")
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				require.NoError(t, r.Lock(ctx))
				require.NoError(t, r.Unlock(ctx))
			}
		}()
	}
	wg.Wait()
	count, err := r.HoldCount(ctx)
	require.NoError(t, err)
	assert.Zero(t, count)
	assert.Nil(t, r.Lost(ctx), "no hold tracked after the last Unlock")
}

func TestClient_LockRacingClose_NeverReturnsAnUnwatchedHold(t *testing.T) {
	e := sharedEnv(t)
	rdb := e.rdb()
	for i := range 30 {
		c := dlock.New(rdb)
		m := c.Mutex(name(t))
		got := make(chan error, 1)
		go func() { got <- m.Lock(context.Background()) }()
		if i%2 == 0 {
			time.Sleep(time.Duration(i*20) * time.Microsecond)
		}
		require.NoError(t, c.Close())
		if err := <-got; err == nil {
			select {
			case <-m.Lost():
			case <-time.After(time.Second):
				t.Fatalf("round %d: Lock succeeded across Close and its hold is not reported lost", i)
			}
		} else {
			assert.ErrorIs(t, err, dlock.ErrClosed)
		}
	}
}

type flag struct {
	mu sync.Mutex
	v  bool
}

func (b *flag) get() bool  { b.mu.Lock(); defer b.mu.Unlock(); return b.v }
func (b *flag) set(v bool) { b.mu.Lock(); b.v = v; b.mu.Unlock() }

// once returns a replyLost matcher that hits the first call of script only.
func firstCallOf(s *redis.Script) func(redis.Cmder) bool {
	var once sync.Once
	return func(cmd redis.Cmder) bool {
		hit := false
		if isScript(cmd, s) {
			once.Do(func() { hit = true })
		}
		return hit
	}
}

func TestSemaphore_AbandonedQueueHead_WaiterBehindServedWhenItsMarkExpires(t *testing.T) {
	e := realEnv(t)
	rdb := e.rdb()
	n := name(t)
	ctx := context.Background()
	s := e.client(rdb).Semaphore(n)
	_, err := s.TrySetPermits(ctx, 1)
	require.NoError(t, err)
	// A waiter that crashed at the head of the queue: its mark runs out in
	// 300ms and nobody will ever cancel it.
	now, err := rdb.Time(ctx).Result()
	require.NoError(t, err)
	m := key(n)
	require.NoError(t, rdb.ZAdd(ctx, m+":q", redis.Z{Score: 0, Member: "ghost"}).Err())
	require.NoError(t, rdb.HSet(ctx, m+":c", "ghost", 1).Err())
	require.NoError(t, rdb.ZAdd(ctx, m+":qe", redis.Z{Score: float64(now.UnixMilli() + 300), Member: "ghost"}).Err())
	start := time.Now()
	p, err := e.client(e.rdb()).Semaphore(n).Acquire(ctxTimeout(t, 5*time.Second), 1)
	require.NoError(t, err, "the waiter behind a dead head slept past its mark (%v)", time.Since(start))
	require.NoError(t, p.Release(ctx))
}

func TestCountDownLatch_ResetRightAfterZero_AwaitStillReturns(t *testing.T) {
	e := sharedEnv(t)
	ctx := context.Background()
	for range 3 {
		n := name(t)
		waiter := e.client(e.rdb()).CountDownLatch(n)
		counter := e.client(e.rdb()).CountDownLatch(n)
		ok, err := counter.TrySetCount(ctx, 1)
		require.NoError(t, err)
		require.True(t, ok)
		done := make(chan error, 1)
		go func() { done <- waiter.Await(ctxTimeout(t, 2*time.Second)) }()
		time.Sleep(100 * time.Millisecond)
		require.NoError(t, counter.CountDown(ctx))
		ok, err = counter.TrySetCount(ctx, 1) // reused at once
		require.NoError(t, err)
		require.True(t, ok)
		assert.NoError(t, <-done, "Await missed a zero that a quick reset hid")
	}
}

func TestRWMutex_FirstWriteTryReplyLost_NoWaitingMarkLeft(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := context.Background()
	reader := e.client(e.rdb()).RWMutex(n, dlock.WithHandleOwner())
	require.NoError(t, reader.RLock(ctx))
	require.NoError(t, scripts.RWTryWrite.Load(ctx, e.rdb()).Err())
	writer := e.client(e.rdb(&replyLost{match: firstCallOf(scripts.RWTryWrite)})).RWMutex(n, dlock.WithHandleOwner())
	require.Error(t, writer.Lock(ctxTimeout(t, 5*time.Second)))
	ok, err := e.client(e.rdb()).RWMutex(n, dlock.WithHandleOwner()).TryRLock(ctx)
	require.NoError(t, err)
	assert.True(t, ok, "no writer waits, yet a leftover mark keeps readers out")
	require.NoError(t, reader.RUnlock(ctx))
}

func TestRWMutex_SameOwnerTwoWaitingLocks_BothGetIn(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := context.Background()
	reader := e.client(e.rdb()).RWMutex(n, dlock.WithHandleOwner())
	require.NoError(t, reader.RLock(ctx))
	rw := e.client(e.rdb()).RWMutex(n, dlock.WithHandleOwner())
	octx := dlock.WithOwner(ctxTimeout(t, 5*time.Second), "o")
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- rw.Lock(octx) }()
	}
	time.Sleep(200 * time.Millisecond)
	require.NoError(t, reader.RUnlock(ctx))
	for range 2 {
		assert.NoError(t, <-errs, "the owner's second Lock re-enters once the first got in")
	}
	require.NoError(t, rw.Unlock(octx))
	require.NoError(t, rw.Unlock(octx))
}

func TestRWMutex_ReleaseReplyLost_LocalWaiterStillWoken(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := context.Background()
	require.NoError(t, scripts.RWUnlockRead.Load(ctx, e.rdb()).Err())
	c := e.client(e.rdb(&replyLost{match: firstCallOf(scripts.RWUnlockRead)}))
	reader := c.RWMutex(n, dlock.WithHandleOwner())
	require.NoError(t, reader.RLock(ctx))
	done := make(chan error, 1)
	go func() { done <- c.RWMutex(n, dlock.WithHandleOwner()).Lock(ctxTimeout(t, 5*time.Second)) }()
	time.Sleep(200 * time.Millisecond)
	require.Error(t, reader.RUnlock(ctx), "the reply is lost, but the read hold is gone on the server")
	assert.NoError(t, <-done, "the local writer must not sleep until its fallback")
}

func TestSemaphore_ReleaseReplyLost_LocalWaiterStillWoken(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := context.Background()
	require.NoError(t, scripts.SemRelease.Load(ctx, e.rdb()).Err())
	s := e.client(e.rdb(&replyLost{match: firstCallOf(scripts.SemRelease)})).Semaphore(n)
	_, err := s.TrySetPermits(ctx, 1)
	require.NoError(t, err)
	p, err := s.Acquire(ctx, 1)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		q, err := s.Acquire(ctxTimeout(t, 5*time.Second), 1)
		if err == nil {
			err = q.Release(ctx)
		}
		done <- err
	}()
	time.Sleep(200 * time.Millisecond)
	require.Error(t, p.Release(ctx))
	assert.NoError(t, <-done, "the local waiter must not sleep until its fallback")
}

func TestRWMutex_WithLeaseReadReentry_KeepsFirstLeaseOnServerToo(t *testing.T) {
	e := realEnv(t)
	n := name(t)
	ctx := context.Background()
	rw := e.client(e.rdb()).RWMutex(n, dlock.WithLease(600*time.Millisecond), dlock.WithHandleOwner())
	require.NoError(t, rw.RLock(ctx))
	time.Sleep(400 * time.Millisecond)
	require.NoError(t, rw.RLock(ctx)) // re-entry must not extend the lease
	within(t, rw.RLost(ctx), time.Second, "the read lease's end")
	time.Sleep(50 * time.Millisecond) // the server's clock started the lease a little later
	ok, err := e.client(e.rdb()).RWMutex(n, dlock.WithHandleOwner()).TryLock(ctx)
	require.NoError(t, err)
	assert.True(t, ok, "the client reported the read hold lost while the server still kept it")
}

func TestReentrantMutex_SameOwnerTwoWaitingLocks_BothGetIn(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := context.Background()
	holder := e.client(e.rdb()).ReentrantMutex(n, dlock.WithHandleOwner())
	require.NoError(t, holder.Lock(ctx))
	r := e.client(e.rdb()).ReentrantMutex(n, dlock.WithHandleOwner())
	octx := dlock.WithOwner(ctxTimeout(t, 5*time.Second), "o")
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- r.Lock(octx) }()
	}
	time.Sleep(200 * time.Millisecond)
	require.NoError(t, holder.Unlock(ctx))
	for range 2 {
		assert.NoError(t, <-errs, "the owner's second Lock re-enters once the first got in")
	}
	count, err := r.HoldCount(octx)
	require.NoError(t, err)
	assert.Equal(t, 2, count)
	require.NoError(t, r.Unlock(octx))
	require.NoError(t, r.Unlock(octx))
}

// dropTryReply lets the next ExclTry run on the server, then reports a
// transport error instead of its reply, as a connection that breaks at that
// moment does.
type dropTryReply struct{ armed atomic.Bool }

func (h *dropTryReply) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *dropTryReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err == nil && isScript(cmd, scripts.ExclTry) && h.armed.CompareAndSwap(true, false) {
			err = errors.New("read: connection reset by peer (simulated)")
			cmd.SetErr(err)
		}
		return err
	}
}

func (h *dropTryReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Review finding: a TryLock whose script handed the free lock to a waiter of
// the same Client, and whose reply was then lost, woke nobody: that waiter
// slept until its fallback timer while holding the lock.
func TestRegress_TryReplyLost_LocalWaiterHandedTheLockIsWoken(t *testing.T) {
	e := sharedEnv(t)
	probe := e.rdb()
	n := name(t)
	ctx := ctxTimeout(t, 30*time.Second)
	h := &dropTryReply{}
	cnt := newCounter()
	c := e.client(e.rdb(h, cnt))
	setHolder(t, probe, n, "gone.1", 20*time.Second) // fallback timer ~20s
	first := c.Mutex(n)
	done := queueUp(t, ctx, probe, n, first, 1)
	// The waiter tries once more when its subscription is confirmed; that
	// try must not be the one whose reply is dropped.
	require.Eventually(t, func() bool { return tries(cnt) >= 2 }, 5*time.Second, time.Millisecond)
	require.NoError(t, probe.HDel(ctx, key(n), "o", "n").Err())
	h.armed.Store(true)
	ok, err := c.Mutex(n).TryLock(ctx)
	require.Error(t, err, "the reply was lost")
	assert.False(t, ok)
	within(t, done, 3*time.Second, "the waiter the lost reply named acquiring")
	require.NoError(t, first.Unlock(ctx))
}

// Review finding: a waiter whose hand-over message never came waited for its
// fallback timer. The watchdog's renewal of its waiting mark finds the place
// gone and wakes it.
func TestRegress_HandoverMessageLost_MarkRenewalWakesTheWaiter(t *testing.T) {
	e := sharedEnv(t)
	probe := e.rdb()
	n := name(t)
	ctx := ctxTimeout(t, 30*time.Second)
	holder := e.client(e.rdb()).Mutex(n, dlock.WithLease(5*time.Second)) // fallback timer ~5s
	require.NoError(t, holder.Lock(ctx))
	holderToken := holderOf(t, probe, n)
	wc := e.client(e.rdb(), dlock.WithWatchdogTimeout(600*time.Millisecond)) // renews marks every 67ms
	waiter := wc.Mutex(n)
	done := queueUp(t, ctx, probe, n, waiter, 1)
	// Release as the holder would, but name the waiter's Client as the
	// releaser, so the script publishes nothing: the message is "lost".
	v, err := scripts.ExclUnlock.Run(ctx, probe, queueKeys(n), "mutex", holderToken, wc.ID(), "0").Slice()
	require.NoError(t, err)
	require.Len(t, v, 4, "handed to the waiter: %v", v)
	within(t, done, 2*time.Second, "the waiter acquiring without the message")
	require.NoError(t, waiter.Unlock(ctx))
}

// Review finding: a waiter that lost its place and queued again took a late
// hand-over message, meant for the earlier place, as a grant, though the
// lock was someone else's: two holders.
func TestRegress_LateHandoverForAnEarlierPlace_IsNotTrusted(t *testing.T) {
	e := sharedEnv(t)
	probe := e.rdb()
	n := name(t)
	ctx := ctxTimeout(t, 30*time.Second)
	hc := e.client(e.rdb())
	holder := hc.Mutex(n)
	require.NoError(t, holder.Lock(ctx))
	holderToken := holderOf(t, probe, n)
	wc := e.client(e.rdb(), dlock.WithWatchdogTimeout(600*time.Millisecond))
	waiter := wc.Mutex(n)
	got := make(chan error, 1)
	go func() { got <- waiter.Lock(ctx) }()
	require.Eventually(t, func() bool { return len(queued(t, probe, n)) == 1 }, 5*time.Second, time.Millisecond)
	_, token, _ := strings.Cut(queued(t, probe, n)[0], ":")
	// The place is purged (as after a whole lease of failed renewals); the
	// renewal finds it gone and the waiter queues again.
	ks := queueKeys(n)
	require.NoError(t, probe.Del(ctx, ks[1], ks[2]).Err())
	require.Eventually(t, func() bool { return len(queued(t, probe, n)) == 1 }, 5*time.Second, 5*time.Millisecond, "queued again")
	// Now a hand-over message for that token arrives, late, while the
	// holder still holds the lock.
	require.NoError(t, probe.Publish(ctx, ks[3], hc.ID()+"|1|g|"+token+"|7").Err())
	select {
	case err := <-got:
		t.Fatalf("Lock returned (%v) while the key holds %q", err, holderOf(t, probe, n))
	case <-time.After(500 * time.Millisecond):
	}
	require.Equal(t, holderToken, holderOf(t, probe, n))
	require.NoError(t, holder.Unlock(ctx))
	require.NoError(t, <-got, "handed the lock for real")
	require.NoError(t, waiter.Unlock(ctx))
}

// spanSeen records the trace context of every command a go-redis client
// sends on its own.
type spanSeen struct {
	mu  sync.Mutex
	ids []trace.TraceID
}

func (s *spanSeen) DialHook(next redis.DialHook) redis.DialHook { return next }

func (s *spanSeen) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		s.mu.Lock()
		s.ids = append(s.ids, trace.SpanContextFromContext(ctx).TraceID())
		s.mu.Unlock()
		return next(ctx, cmd)
	}
}

func (s *spanSeen) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Review finding: a shortcut that skipped dlock's spans while the global
// tracer provider was unset also hid the caller's trace from go-redis hooks
// (redisotel, for one), whose spans then became orphans.
func TestRegress_CallerTraceReachesRedisHooks(t *testing.T) {
	e := sharedEnv(t)
	seen := &spanSeen{}
	cnt := newCounter()
	c := e.client(e.rdb(seen, cnt)) // follows the OpenTelemetry globals
	// The Client's own background work (renewal connections, renewals)
	// carries no caller's trace: let the warm-up pass first.
	warm := c.Mutex(name(t))
	require.NoError(t, warm.Lock(context.Background()))
	require.NoError(t, warm.Unlock(context.Background()))
	warmedUp(t, cnt)
	seen.mu.Lock()
	seen.ids = nil
	seen.mu.Unlock()
	tp := sdktrace.NewTracerProvider()
	defer func() { _ = tp.Shutdown(context.Background()) }()
	ctx, sp := tp.Tracer("app").Start(ctxTimeout(t, 10*time.Second), "request")
	defer sp.End()
	m := c.Mutex(name(t))
	require.NoError(t, m.Lock(ctx))
	require.NoError(t, m.Unlock(ctx))
	seen.mu.Lock()
	defer seen.mu.Unlock()
	require.NotEmpty(t, seen.ids)
	for _, id := range seen.ids {
		assert.Equal(t, sp.SpanContext().TraceID(), id, "the caller's trace reaches the command")
	}
}
