package dlock_test

// Regression tests for defects found in review of the core.

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/scripts"
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

func isScript(cmd redis.Cmder, s *redis.Script) bool {
	args := cmd.Args()
	return strings.EqualFold(cmd.Name(), "evalsha") && len(args) > 1 && args[1] == s.Hash()
}

func TestMutex_ReplyLostOnAcquire_LeavesNoHold(t *testing.T) {
	e := sharedEnv(t)
	rdb := e.rdb(&replyLost{match: func(cmd redis.Cmder) bool { return strings.EqualFold(cmd.Name(), "set") }})
	n := name(t)
	m := e.client(rdb).Mutex(n)
	ctx := context.Background()
	require.Error(t, m.Lock(ctx))
	exists, err := e.rdb().Exists(ctx, key(n)).Result()
	require.NoError(t, err)
	assert.Zero(t, exists, "a Lock that failed in transit must not leave its hold for the lease")
}

func TestReentrantMutex_ReplyLostOnNestedLock_CountStaysRight(t *testing.T) {
	e := sharedEnv(t)
	var fail flag
	rdb := e.rdb(&replyLost{match: func(cmd redis.Cmder) bool { return fail.get() && isScript(cmd, scripts.ReentrantTry) }})
	n := name(t)
	r := e.client(rdb).ReentrantMutex(n)
	ctx := context.Background()
	require.NoError(t, r.Lock(ctx))
	fail.set(true)
	require.Error(t, r.Lock(ctx), "nested Lock whose reply was lost")
	fail.set(false)
	count, err := r.HoldCount(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, count, "the lost nested hold was given back")
	require.NoError(t, r.Unlock(ctx))
	exists, err := e.rdb().Exists(ctx, key(n)).Result()
	require.NoError(t, err)
	assert.Zero(t, exists, "the outer Unlock releases the lock")
}

func TestReentrantMutex_KeyVanishedThenOwnerLocksAgain_OldHoldReportedLost(t *testing.T) {
	e := sharedEnv(t)
	rdb := e.rdb()
	n := name(t)
	r := e.client(rdb).ReentrantMutex(n)
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
	r := e.client(e.rdb()).ReentrantMutex(name(t))
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
