package redisson_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/redisson"
	"github.com/dlock-go/dlock/redisson/internal/javapeer"
)

// env is one real redis-server with a Go Client and a Java-side peer on it.
type env struct {
	rdb  *redis.Client
	go_  *redisson.Client
	java *javapeer.Client
}

// newEnv starts a redis-server for t (skipping t without one, unless
// DLOCK_REQUIRE_REDIS=1), with a Go Client and a peer whose watchdog
// timeout is watchdog (0: Redisson's 30 s).
func newEnv(t *testing.T, watchdog time.Duration, opts ...redisson.Option) *env {
	t.Helper()
	srv := redistest.Real(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	if watchdog > 0 {
		opts = append([]redisson.Option{redisson.WithWatchdogTimeout(watchdog)}, opts...)
	}
	c := redisson.New(rdb, opts...)
	t.Cleanup(func() { _ = c.Close() })
	p := javapeer.New(rdb, false, watchdog)
	t.Cleanup(p.Close)
	return &env{rdb: rdb, go_: c, java: p}
}

// ctxT returns a context ending at d or at t's end.
func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// owner returns a context of the owner called o.
func owner(ctx context.Context, o string) context.Context { return dlock.WithOwner(ctx, o) }

// awaitSubscribers waits until channel has n classic subscribers.
func awaitSubscribers(t *testing.T, rdb redis.UniversalClient, channel string, n int64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		m, err := rdb.PubSubNumSub(context.Background(), channel).Result()
		require.NoError(t, err)
		if m[channel] >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("channel %q has %d subscribers, want %d", channel, m[channel], n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// result runs f in a goroutine and returns a channel of its error and of
// how long it took.
func result(f func() error) <-chan timed {
	ch := make(chan timed, 1)
	start := time.Now()
	go func() {
		err := f()
		ch <- timed{err, time.Since(start)}
	}()
	return ch
}

type timed struct {
	err  error
	took time.Duration
}

func recv(t *testing.T, ch <-chan timed, within time.Duration) timed {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(within):
		t.Fatalf("no result within %v", within)
		return timed{}
	}
}

func notYet(t *testing.T, ch <-chan timed, d time.Duration) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("returned early (after %v, err %v)", r.took, r.err)
	case <-time.After(d):
	}
}

// fieldOK checks the shape of a holder field: <uuid>:<decimal>.
func fieldOK(t *testing.T, field, uuid string) {
	t.Helper()
	id, tid, ok := strings.Cut(field, ":")
	require.True(t, ok, "field %q", field)
	require.Equal(t, uuid, id)
	var n int64
	_, err := fmt.Sscanf(tid, "%d", &n)
	require.NoError(t, err, "thread id %q of field %q", tid, field)
	require.Equal(t, fmt.Sprint(n), tid)
}
