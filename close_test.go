package dlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
)

func TestClient_Close_UnblocksWaitersAndLeaksNoGoroutine(t *testing.T) {
	e := sharedEnv(t)
	rdb := e.rdb()
	holderClient := e.client(rdb)
	ignore := goleak.IgnoreCurrent()

	c := dlock.New(rdb)
	n := name(t)
	held := holderClient.Mutex(n)
	ctx := ctxTimeout(t, 10*time.Second)
	require.NoError(t, held.Lock(ctx))
	mine := c.Mutex(n + "-mine")
	require.NoError(t, mine.Lock(ctx)) // starts a lease on the watchdog

	errs := make(chan error, 4)
	for range 4 {
		go func() { errs <- c.Mutex(n).Lock(ctx) }()
	}
	time.Sleep(200 * time.Millisecond) // blocked, subscribed
	require.NoError(t, c.Close())
	for range 4 {
		select {
		case err := <-errs:
			assert.ErrorIs(t, err, dlock.ErrClosed)
		case <-time.After(2 * time.Second):
			t.Fatal("a blocked Lock did not return after Close")
		}
	}
	require.NoError(t, c.Close(), "Close is idempotent")
	_, err := c.Mutex(n).TryLock(context.Background())
	assert.ErrorIs(t, err, dlock.ErrClosed)
	// An embedded miniredis serves connections from goroutines of this
	// process; they are the server's, not dlock's.
	goleak.VerifyNone(t, ignore,
		goleak.IgnoreAnyFunction("github.com/alicebob/miniredis/v2/server.(*Server).servePeer"),
		goleak.IgnoreAnyFunction("github.com/alicebob/miniredis/v2/server.(*Server).servePeer.func2"))
	require.NoError(t, held.Unlock(ctx))
}
