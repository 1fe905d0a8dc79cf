package embedded_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock/internal/embedded"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func start(t *testing.T) *redis.Client {
	t.Helper()
	s, err := embedded.Start("")
	require.NoError(t, err)
	t.Cleanup(s.Close)
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// slack is how far the clock may trail: Step plus scheduling delays, more
// under the race detector on a busy machine.
const slack = 25 * time.Millisecond

func TestKeyWithPX_ExpiresAfterItsTTLInRealTime(t *testing.T) {
	rdb := start(t)
	ctx := context.Background()
	const ttl = 300 * time.Millisecond
	require.NoError(t, rdb.Set(ctx, "k", "v", ttl).Err())
	set := time.Now()
	var gone time.Duration
	for {
		n, err := rdb.Exists(ctx, "k").Result()
		require.NoError(t, err)
		if n == 0 {
			gone = time.Since(set)
			break
		}
		require.Less(t, time.Since(set), 2*time.Second, "the key never expired")
		time.Sleep(200 * time.Microsecond)
	}
	t.Logf("a key set with PX 300 was gone after %v", gone)
	assert.GreaterOrEqual(t, gone, ttl-slack)
	assert.LessOrEqual(t, gone, ttl+slack)
}

func TestPTTL_CountsDownInRealTime(t *testing.T) {
	rdb := start(t)
	ctx := context.Background()
	require.NoError(t, rdb.Set(ctx, "k", "v", time.Second).Err())
	time.Sleep(200 * time.Millisecond)
	left, err := rdb.PTTL(ctx, "k").Result()
	require.NoError(t, err)
	t.Logf("PTTL 200ms after PX 1000: %v", left)
	assert.InDelta(t, float64(800*time.Millisecond), float64(left), float64(slack))
}

func TestTIME_FollowsTheWallClock_AlsoInScripts(t *testing.T) {
	rdb := start(t)
	ctx := context.Background()
	for range 3 {
		before := time.Now()
		got, err := rdb.Time(ctx).Result()
		after := time.Now()
		require.NoError(t, err)
		t.Logf("TIME read %v into a round trip of %v", got.Sub(before), after.Sub(before))
		assert.WithinRange(t, got, before.Add(-slack), after)

		v, err := rdb.Eval(ctx, "return redis.call('TIME')", nil).Slice()
		require.NoError(t, err)
		sec, _ := strconv.ParseInt(v[0].(string), 10, 64)
		usec, _ := strconv.ParseInt(v[1].(string), 10, 64)
		assert.WithinRange(t, time.Unix(sec, usec*1000), before.Add(-slack), time.Now())
		time.Sleep(50 * time.Millisecond)
	}
}

// Commands sent one after another see TIME strictly increase, to the
// microsecond, as on a real server: dlock orders its queues by it.
func TestTIME_StrictlyIncreasesAcrossSequentialCommands(t *testing.T) {
	rdb := start(t)
	ctx := context.Background()
	var last time.Time
	for i := range 200 {
		var got time.Time
		if i%2 == 0 {
			v, err := rdb.Eval(ctx, "return redis.call('TIME')", nil).Slice()
			require.NoError(t, err)
			sec, _ := strconv.ParseInt(v[0].(string), 10, 64)
			usec, _ := strconv.ParseInt(v[1].(string), 10, 64)
			got = time.Unix(sec, usec*1000)
		} else {
			var err error
			got, err = rdb.Time(ctx).Result()
			require.NoError(t, err)
		}
		require.True(t, got.After(last), "TIME %v after %v", got, last)
		last = got
	}
}

// A command arriving while another client's script runs sees the clock as
// of when it runs (after the script, as on Redis), not as it was when the
// script started.
func TestTIME_CommandArrivingDuringAScript_SeesAFreshClock(t *testing.T) {
	rdb := start(t)
	ctx := context.Background()
	other := redis.NewClient(&redis.Options{Addr: rdb.Options().Addr, PoolSize: 1})
	t.Cleanup(func() { _ = other.Close() })
	require.NoError(t, other.Ping(ctx).Err()) // seen idle once
	busy := make(chan error, 1)
	go func() {
		busy <- rdb.Eval(ctx, "for i = 1, 20000 do redis.call('EXISTS', 'x') end return 1", nil).Err()
	}()
	time.Sleep(30 * time.Millisecond) // the script runs for ~100 ms
	sent := time.Now()
	got, err := other.Time(ctx).Result()
	require.NoError(t, err)
	require.NoError(t, <-busy)
	t.Logf("TIME %v after it was sent, reply %v after", got.Sub(sent), time.Since(sent))
	assert.WithinRange(t, got, sent.Add(-2*time.Millisecond), time.Now())
}

func TestPEXPIREAT_AgreesWithTIME(t *testing.T) {
	rdb := start(t)
	ctx := context.Background()
	now, err := rdb.Time(ctx).Result()
	require.NoError(t, err)
	require.NoError(t, rdb.Set(ctx, "k", "v", 0).Err())
	require.NoError(t, rdb.PExpireAt(ctx, "k", now.Add(500*time.Millisecond)).Err())
	left, err := rdb.PTTL(ctx, "k").Result()
	require.NoError(t, err)
	assert.InDelta(t, float64(500*time.Millisecond), float64(left), float64(slack))
}

// A script that finds a key about to expire sees it for its whole run, and
// TIME does not move within it: the clock stands still while a script runs.
func TestScript_ClockStandsStill_KeyDoesNotExpireHalfwayThrough(t *testing.T) {
	rdb := start(t)
	ctx := context.Background()
	require.NoError(t, rdb.Set(ctx, "k", "v", 5*time.Millisecond).Err())
	script := `
local t0 = redis.call('TIME')
local first = redis.call('EXISTS', KEYS[1])
for i = 1, 20000 do
  if redis.call('EXISTS', KEYS[1]) ~= first then return {first, 'changed', i} end
end
local t1 = redis.call('TIME')
return {first, t0[1] .. '.' .. t0[2], t1[1] .. '.' .. t1[2]}`
	begin := time.Now()
	v, err := rdb.Eval(ctx, script, []string{"k"}).Slice()
	took := time.Since(begin)
	require.NoError(t, err)
	t.Logf("script ran %v: %v", took, v)
	require.Greater(t, took, 10*time.Millisecond, "the script ran too briefly to show anything")
	assert.EqualValues(t, 1, v[0])
	assert.Equal(t, v[1], v[2], "TIME moved, or the key expired, during the script")
}

func TestClose_StopsTheClockAndIsIdempotent(t *testing.T) {
	s, err := embedded.Start("127.0.0.1:0")
	require.NoError(t, err)
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr()})
	require.NoError(t, rdb.Ping(context.Background()).Err())
	require.NoError(t, rdb.Close())
	s.Close()
	s.Close()
	goleak.VerifyNone(t)
}
