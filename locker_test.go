package dlock_test

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock"
)

// Many goroutines on two Clients, through sync.Locker views of shared and
// separate handles, exclude each other: a read-then-write counter ends
// exact.
func TestLocker_ManyGoroutines_CounterExact(t *testing.T) {
	e := sharedEnv(t)
	ctx := ctxTimeout(t, 60*time.Second)
	check := e.rdb()
	clients := []*dlock.Client{e.client(e.rdb()), e.client(e.rdb())}
	n := name(t)
	const goroutines, rounds = 8, 20
	var inside, overlaps atomic.Int32
	var wg sync.WaitGroup
	for _, c := range clients {
		shared := c.Mutex(n).Locker()
		for g := range goroutines {
			l := shared
			if g%2 == 1 {
				l = c.Mutex(n).Locker()
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range rounds {
					l.Lock()
					if inside.Add(1) != 1 {
						overlaps.Add(1)
					}
					v, err := check.Get(ctx, n+":counter").Int()
					if err != nil && !errors.Is(err, redis.Nil) {
						t.Error(err)
					}
					if err := check.Set(ctx, n+":counter", v+1, time.Minute).Err(); err != nil {
						t.Error(err)
					}
					inside.Add(-1)
					l.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	got, err := check.Get(ctx, n+":counter").Int()
	require.NoError(t, err)
	assert.Equal(t, len(clients)*goroutines*rounds, got)
	assert.Zero(t, overlaps.Load())
}

// panicErr runs f and returns what it panicked with, as an error.
func panicErr(t *testing.T, f func()) (err error) {
	t.Helper()
	defer func() {
		r := recover()
		if r == nil {
			t.Fatal("did not panic")
		}
		var ok bool
		err, ok = r.(error)
		if !ok {
			t.Fatalf("panicked with %v, not an error", r)
		}
	}()
	f()
	return nil
}

func TestLocker_PanicsOnErrors(t *testing.T) {
	e := sharedEnv(t)
	assert.ErrorIs(t, panicErr(t, dlock.New(nil).Mutex("x").Locker().Lock), dlock.ErrInvalid)
	assert.ErrorIs(t, panicErr(t, dlock.New(nil).Mutex("x").Locker().Unlock), dlock.ErrInvalid)
	var nilMutex *dlock.Mutex
	assert.ErrorIs(t, panicErr(t, nilMutex.Locker().Lock), dlock.ErrInvalid)
	assert.ErrorIs(t, panicErr(t, nilMutex.Locker().Unlock), dlock.ErrInvalid)

	c := e.client(e.rdb())
	assert.ErrorIs(t, panicErr(t, c.Mutex("").Locker().Lock), dlock.ErrInvalid)
	l := c.Mutex(name(t)).Locker()
	assert.ErrorIs(t, panicErr(t, l.Unlock), dlock.ErrNotHeld, "Unlock of a lock not held")

	closed := e.client(e.rdb())
	require.NoError(t, closed.Close())
	assert.ErrorIs(t, panicErr(t, closed.Mutex(name(t)).Locker().Lock), dlock.ErrClosed)

	// A Lock blocked when its Client closes panics with ErrClosed.
	c2 := e.client(e.rdb())
	n := name(t)
	require.NoError(t, c.Mutex(n).Lock(ctxTimeout(t, 5*time.Second)))
	got := make(chan error, 1)
	go func() {
		defer func() { got <- recover().(error) }()
		c2.Mutex(n).Locker().Lock()
	}()
	time.Sleep(100 * time.Millisecond)
	require.NoError(t, c2.Close())
	select {
	case err := <-got:
		assert.ErrorIs(t, err, dlock.ErrClosed)
	case <-time.After(5 * time.Second):
		t.Fatal("a blocked Locker.Lock did not panic when its Client closed")
	}
}
