package coalesce_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock/internal/coalesce"
	"github.com/dlock-go/dlock/internal/redistest"
)

func TestMain(m *testing.M) {
	// After its server went away, a closed go-redis pool's redial loop can
	// still be sleeping out its last second.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}

// trips counts what a client sends of the tests' own commands (not the
// connection handshakes go-redis pipelines on each new connection): single
// commands and pipelines.
type trips struct {
	single, pipelines, piped, biggest atomic.Int64
}

func (t *trips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (t *trips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if ours(cmd) {
			t.single.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (t *trips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !ours(cmds[0]) {
			return next(ctx, cmds)
		}
		t.pipelines.Add(1)
		t.piped.Add(int64(len(cmds)))
		for n := int64(len(cmds)); ; {
			b := t.biggest.Load()
			if n <= b || t.biggest.CompareAndSwap(b, n) {
				break
			}
		}
		return next(ctx, cmds)
	}
}

func ours(cmd redis.Cmder) bool { return cmd.Name() == "incr" || cmd.Name() == "echo" }

func client(t *testing.T, srv *redistest.Server, hooks ...redis.Hook) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 16})
	for _, h := range hooks {
		rdb.AddHook(h)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

func TestDo_LoneCall_SentAloneAtOnce(t *testing.T) {
	srv := redistest.Real(t)
	tr := &trips{}
	co := coalesce.New(client(t, srv, tr), 4)
	ctx := context.Background()
	for i := range 5 {
		cmd := redis.NewIntCmd(ctx, "incr", "lone")
		require.NoError(t, co.Do(ctx, cmd))
		assert.EqualValues(t, i+1, cmd.Val())
	}
	assert.EqualValues(t, 5, tr.single.Load(), "one round trip per call")
	assert.Zero(t, tr.pipelines.Load(), "nothing to coalesce with")
}

func TestDo_ConcurrentCalls_EachGetsItsOwnReply(t *testing.T) {
	srv := redistest.Real(t)
	tr := &trips{}
	co := coalesce.New(client(t, srv, tr), 2)
	ctx := context.Background()
	const goroutines, each = 64, 100
	var mu sync.Mutex
	seen := make(map[int64]bool)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for range each {
				// Every reply must reach the caller whose command it
				// answers: INCR returns distinct values, and ECHO returns
				// what this goroutine sent.
				cmd := redis.NewIntCmd(ctx, "incr", "shared")
				if !assert.NoError(t, co.Do(ctx, cmd)) {
					return
				}
				mine := redis.NewStringCmd(ctx, "echo", g)
				if !assert.NoError(t, co.Do(ctx, mine)) {
					return
				}
				assert.Equal(t, strconv.Itoa(g), mine.Val(), "a reply went to the wrong caller")
				mu.Lock()
				assert.False(t, seen[cmd.Val()], "INCR value %d handed out twice", cmd.Val())
				seen[cmd.Val()] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	assert.Len(t, seen, goroutines*each)
	calls := int64(2 * goroutines * each)
	sent := tr.single.Load() + tr.piped.Load()
	assert.Equal(t, calls, sent, "every command sent exactly once")
	roundTrips := tr.single.Load() + tr.pipelines.Load()
	assert.Less(t, roundTrips, calls/2, "concurrent commands share round trips")
	t.Logf("%d commands in %d round trips (largest pipeline %d)", calls, roundTrips, tr.biggest.Load())
}

func TestRun_AfterScriptFlush_FallsBackToEval(t *testing.T) {
	srv := redistest.Real(t)
	rdb := client(t, srv)
	co := coalesce.New(rdb, 4)
	ctx := context.Background()
	script := redis.NewScript(`return redis.call('INCRBY', KEYS[1], ARGV[1])`)
	require.NoError(t, rdb.ScriptFlush(ctx).Err())
	v, err := co.Run(ctx, script, []string{"k"}, 5).Int64()
	require.NoError(t, err)
	assert.EqualValues(t, 5, v)
	v, err = co.Run(ctx, script, []string{"k"}, 2).Int64()
	require.NoError(t, err)
	assert.EqualValues(t, 7, v)
}

// RunBoxed sends the boxed keys as the script's KEYS, alone or in a shared
// pipeline, and falls back to EVAL with them after a SCRIPT FLUSH.
func TestRunBoxed_ConcurrentCalls_EachScriptSeesItsOwnKeysAndArgs(t *testing.T) {
	srv := redistest.Real(t)
	rdb := client(t, srv)
	co := coalesce.New(rdb, 1)
	ctx := context.Background()
	script := redis.NewScript(`return #KEYS .. ':' .. table.concat(KEYS, ',') .. ':' .. table.concat(ARGV, ',')`)
	require.NoError(t, rdb.ScriptFlush(ctx).Err())
	var wg sync.WaitGroup
	for g := range 20 {
		wg.Go(func() {
			keys := []string{"a" + strconv.Itoa(g), "b" + strconv.Itoa(g)}
			boxed := []any{keys[0], keys[1]}
			for i := range 10 {
				got, err := co.RunBoxed(ctx, script, keys, boxed, g, i).Text()
				if assert.NoError(t, err) {
					assert.Equal(t, "2:"+keys[0]+","+keys[1]+":"+strconv.Itoa(g)+","+strconv.Itoa(i), got)
				}
			}
		})
	}
	wg.Wait()
}

func TestDo_ServerGone_EveryCallerGetsAnError(t *testing.T) {
	srv := redistest.Real(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 4, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	co := coalesce.New(rdb, 2)
	ctx := context.Background()
	require.NoError(t, co.Do(ctx, redis.NewStatusCmd(ctx, "ping")))
	srv.Stop()
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range 32 {
		wg.Go(func() {
			if co.Do(ctx, redis.NewStatusCmd(ctx, "ping")) != nil {
				failed.Add(1)
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("callers hung after the server went away")
	}
	assert.EqualValues(t, 32, failed.Load())
}

func TestDo_MixedReplies_ErrorsStayWithTheirCommand(t *testing.T) {
	srv := redistest.Real(t)
	rdb := client(t, srv)
	co := coalesce.New(rdb, 1) // one pipeline in flight: the rest queue up together
	ctx := context.Background()
	require.NoError(t, rdb.HSet(ctx, "h", "f", 1).Err())
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() {
			if i%2 == 0 {
				cmd := redis.NewStringCmd(ctx, "get", "h") // WRONGTYPE
				assert.ErrorContains(t, co.Do(ctx, cmd), "WRONGTYPE")
			} else {
				cmd := redis.NewIntCmd(ctx, "hlen", "h")
				assert.NoError(t, co.Do(ctx, cmd))
				assert.EqualValues(t, 1, cmd.Val())
			}
		})
	}
	wg.Wait()
}

// panicky panics once, in the middle of sending an ECHO, as a faulty user
// hook on the go-redis client might.
type panicky struct{ armed atomic.Bool }

func (p *panicky) DialHook(next redis.DialHook) redis.DialHook { return next }

func (p *panicky) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "echo" && p.armed.CompareAndSwap(true, false) {
			panic("hook failed")
		}
		return next(ctx, cmd)
	}
}

func (p *panicky) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func TestDo_PanicWhileSending_FreesTheSlot(t *testing.T) {
	srv := redistest.Real(t)
	h := &panicky{}
	h.armed.Store(true)
	co := coalesce.New(client(t, srv, h), 1)
	ctx := context.Background()
	assert.Panics(t, func() { _ = co.Do(ctx, redis.NewStringCmd(ctx, "echo", "x")) })
	done := make(chan error, 1)
	go func() { done <- co.Do(ctx, redis.NewStatusCmd(ctx, "ping")) }()
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("the only in-flight slot was never given back")
	}
}

// Calls that each have a deadline, on a stalled server: a call sent alone
// ends at its own deadline, and a pipeline of queued calls at the latest of
// theirs (with ContextTimeoutEnabled), not when the server answers again.
// Calls without a deadline in a pipeline wait for the server.
func TestDo_StalledServer_PipelineEndsAtItsCallsLatestDeadline(t *testing.T) {
	srv := redistest.Real(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 8, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	adm := client(t, srv)
	co := coalesce.New(rdb, 1)
	bg := context.Background()
	require.NoError(t, co.Do(bg, redis.NewStatusCmd(bg, "ping"))) // a warm connection
	const pause = 2 * time.Second
	require.NoError(t, adm.Do(bg, "client", "pause", pause.Milliseconds(), "all").Err())
	t.Cleanup(func() { adm.Do(context.Background(), "client", "unpause") })
	start := time.Now()
	var wg sync.WaitGroup
	ended := make([]time.Duration, 4)
	for i, d := range []time.Duration{300, 400, 500, 450} {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(bg, d*time.Millisecond)
			defer cancel()
			err := co.Do(ctx, redis.NewCmd(ctx, "echo", "x"))
			assert.Error(t, err, "call %d answered by a paused server", i)
			ended[i] = time.Since(start)
		})
		time.Sleep(20 * time.Millisecond) // the first is sent alone, the others queue behind it
	}
	wg.Wait()
	t.Logf("calls ended after %v", ended)
	assert.Less(t, ended[0], 450*time.Millisecond, "the lone call ends at its deadline")
	for i := 1; i < 4; i++ {
		assert.GreaterOrEqual(t, ended[i], 440*time.Millisecond, "call %d: its pipeline lasts until its latest deadline", i)
		assert.Less(t, ended[i], pause-500*time.Millisecond, "call %d outlived its pipeline's deadline", i)
	}
}
