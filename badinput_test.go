package dlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock"
)

func TestBadInput_ClearErrorAndNothingSent(t *testing.T) {
	e := sharedEnv(t)
	cnt := newCounter()
	rdb := e.rdb(cnt)
	c := e.client(rdb)
	ctx := context.Background()
	cases := []struct {
		name string
		call func() error
	}{
		{"mutex empty name", func() error { return c.Mutex("").Lock(ctx) }},
		{"mutex name starting with }", func() error { return c.Mutex("}x").Lock(ctx) }},
		{"mutex negative lease", func() error { return c.Mutex("ok", dlock.WithLease(-time.Second)).Lock(ctx) }},
		{"mutex zero lease", func() error { _, err := c.Mutex("ok", dlock.WithLease(0)).TryLock(ctx); return err }},
		{"mutex unlock empty name", func() error { return c.Mutex("").Unlock(ctx) }},
		{"reentrant empty name", func() error { return c.ReentrantMutex("", dlock.WithHandleOwner()).Lock(ctx) }},
		{"reentrant negative lease", func() error { return c.ReentrantMutex("ok", dlock.WithLease(-1), dlock.WithHandleOwner()).Lock(ctx) }},
		{"reentrant empty owner", func() error { return c.ReentrantMutex("ok", dlock.WithHandleOwner()).Lock(dlock.WithOwner(ctx, "")) }},
		{"reentrant forceunlock empty name", func() error { _, err := c.ReentrantMutex("", dlock.WithHandleOwner()).ForceUnlock(ctx); return err }},
		{"reentrant holdcount empty name", func() error { _, err := c.ReentrantMutex("", dlock.WithHandleOwner()).HoldCount(ctx); return err }},
		{"nil client", func() error { return dlock.New(nil).Mutex("ok").Lock(ctx) }},
		{"typed nil client", func() error {
			return dlock.New((*redis.Client)(nil)).ReentrantMutex("ok", dlock.WithHandleOwner()).Lock(ctx)
		}},
		{"negative watchdog timeout", func() error { return dlock.New(rdb, dlock.WithWatchdogTimeout(-time.Second)).Mutex("ok").Lock(ctx) }},
		{"prefix with brace", func() error { return dlock.New(rdb, dlock.WithKeyPrefix("a{b")).Mutex("ok").Lock(ctx) }},
		// Leases and timeouts that could never be granted, or kept, and names
		// too long to be keys: refused at once, naming the bound (issue 23).
		{"lease below the minimum: dlock.MinLease", func() error { return c.Mutex("ok", dlock.WithLease(time.Millisecond)).Lock(ctx) }},
		{"lease above the maximum: dlock.MaxLease", func() error { return c.Mutex("ok", dlock.WithLease(dlock.MaxLease+time.Second)).Lock(ctx) }},
		{"watchdog timeout below the minimum: dlock.MinLease", func() error {
			return dlock.New(rdb, dlock.WithWatchdogTimeout(time.Millisecond)).Mutex("ok").Lock(ctx)
		}},
		{"watchdog timeout of math.MaxInt64: dlock.MaxLease", func() error {
			return dlock.New(rdb, dlock.WithWatchdogTimeout(time.Duration(1<<63-1))).Mutex("ok").Lock(ctx)
		}},
		{"renewed lease below the minimum: dlock.MinLease", func() error {
			return c.Election("ok", dlock.WithRenewedLease(5*time.Millisecond)).Campaign(ctx, "v")
		}},
		{"fixed and renewed lease together: WithLease and WithRenewedLease", func() error {
			return c.Mutex("ok", dlock.WithLease(time.Second), dlock.WithRenewedLease(time.Second)).Lock(ctx)
		}},
		{"permit lease below the minimum: dlock.MinLease", func() error {
			_, err := c.Semaphore("ok", dlock.WithPermitLease(time.Millisecond)).Acquire(ctx, 1)
			return err
		}},
		{"renewed permit lease above the maximum: dlock.MaxLease", func() error {
			_, err := c.Semaphore("ok", dlock.WithRenewedPermitLease(dlock.MaxLease*2)).Acquire(ctx, 1)
			return err
		}},
		{"fixed and renewed permit lease together: WithPermitLease and WithRenewedPermitLease", func() error {
			_, err := c.Semaphore("ok", dlock.WithPermitLease(time.Second), dlock.WithRenewedPermitLease(time.Second)).Acquire(ctx, 1)
			return err
		}},
		{"extend below the minimum: dlock.MinLease", func() error { return c.Mutex("ok").Extend(ctx, 5*time.Millisecond) }},
		{"name too long: dlock.MaxNameLength", func() error { return c.Mutex(strings.Repeat("n", dlock.MaxNameLength+1)).Lock(ctx) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			assert.ErrorIs(t, err, dlock.ErrInvalid)
			if _, bound, ok := strings.Cut(tc.name, ": "); ok {
				assert.Contains(t, err.Error(), bound, "the error names the bound")
			}
		})
	}
	assert.Zero(t, cnt.total(), "bad input must send nothing to Redis")
}

func TestBadInput_KeyOfWrongType_ErrorAndKeyUntouched(t *testing.T) {
	e := sharedEnv(t)
	rdb := e.rdb()
	c := e.client(rdb)
	ctx := ctxTimeout(t, 10*time.Second)

	hashName, stringName := name(t)+"-hash", name(t)+"-string"
	require.NoError(t, rdb.HSet(ctx, key(hashName), "user", "data").Err())
	require.NoError(t, rdb.Set(ctx, key(stringName), "user data", 0).Err())

	check := func(err error) {
		t.Helper()
		require.Error(t, err)
		assert.Contains(t, err.Error(), "not a lock of this kind")
		assert.False(t, errors.Is(err, dlock.ErrNotObtained))
	}
	check(c.Mutex(hashName).Lock(ctx))
	_, err := c.Mutex(hashName).TryLock(ctx)
	check(err)
	check(c.ReentrantMutex(stringName, dlock.WithHandleOwner()).Lock(ctx))
	_, err = c.ReentrantMutex(stringName, dlock.WithHandleOwner()).TryLock(ctx)
	check(err)
	_, err = c.ReentrantMutex(stringName, dlock.WithHandleOwner()).ForceUnlock(ctx)
	check(err)
	_, err = c.ReentrantMutex(stringName, dlock.WithHandleOwner()).IsLocked(ctx)
	check(err)

	v, err := rdb.HGet(ctx, key(hashName), "user").Result()
	require.NoError(t, err)
	assert.Equal(t, "data", v)
	s, err := rdb.Get(ctx, key(stringName)).Result()
	require.NoError(t, err)
	assert.Equal(t, "user data", s)
	ttl, err := rdb.TTL(ctx, key(stringName)).Result()
	require.NoError(t, err)
	assert.Equal(t, time.Duration(-1), ttl, "no expiry added to a foreign key")
}

func TestBadInput_RedisDown_ErrorsNotPanics(t *testing.T) {
	e := realEnv(t)
	rdb := redis.NewClient(&redis.Options{Addr: e.srv.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer rdb.Close()
	c := dlock.New(rdb)
	defer c.Close()
	e.srv.Stop()
	ctx := ctxTimeout(t, 5*time.Second)
	assert.Error(t, c.Mutex("down").Lock(ctx))
	_, err := c.Mutex("down").TryLock(ctx)
	assert.Error(t, err)
	assert.Error(t, c.ReentrantMutex("down", dlock.WithHandleOwner()).Lock(ctx))
	_, err = c.ReentrantMutex("down", dlock.WithHandleOwner()).HoldCount(ctx)
	assert.Error(t, err)
}
