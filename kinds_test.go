package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock"
)

// kindSetup makes a live primitive of one kind on a name.
type kindSetup struct {
	kind  string
	found string // what the error says the main key holds
	make  func(t *testing.T, ctx context.Context, c *dlock.Client, n string)
}

var kindSetups = []kindSetup{
	{"mutex", "a mutex", func(t *testing.T, ctx context.Context, c *dlock.Client, n string) {
		require.NoError(t, c.Mutex(n).Lock(ctx))
	}},
	{"reentrant", "a reentrant_mutex", func(t *testing.T, ctx context.Context, c *dlock.Client, n string) {
		require.NoError(t, c.ReentrantMutex(n, dlock.WithHandleOwner()).Lock(ctx))
	}},
	{"rwmutex writer", "a rwlock", func(t *testing.T, ctx context.Context, c *dlock.Client, n string) {
		require.NoError(t, c.RWMutex(n, dlock.WithHandleOwner()).Lock(ctx))
	}},
	{"rwmutex readers only", "a rwlock", func(t *testing.T, ctx context.Context, c *dlock.Client, n string) {
		require.NoError(t, c.RWMutex(n, dlock.WithHandleOwner()).RLock(ctx))
	}},
	{"semaphore", "a semaphore", func(t *testing.T, ctx context.Context, c *dlock.Client, n string) {
		s := c.Semaphore(n)
		require.NoError(t, s.SetPermits(ctx, 2))
		_, err := s.Acquire(ctx, 1)
		require.NoError(t, err)
	}},
	{"election", "an election", func(t *testing.T, ctx context.Context, c *dlock.Client, n string) {
		require.NoError(t, c.Election(n).Campaign(ctx, "leader"))
	}},
	{"latch", "a latch", func(t *testing.T, ctx context.Context, c *dlock.Client, n string) {
		ok, err := c.CountDownLatch(n).TrySetCount(ctx, 3)
		require.NoError(t, err)
		require.True(t, ok)
	}},
}

// kindOp is one call of one kind of primitive.
type kindOp struct {
	kind string // the kindSetup it belongs to (it may run on its own kind)
	name string
	run  func(ctx context.Context, c *dlock.Client, n string) error
}

func dropOK[T any](_ T, err error) error { return err }

var kindOps = []kindOp{
	{"mutex", "Mutex.Lock", func(ctx context.Context, c *dlock.Client, n string) error { return c.Mutex(n).Lock(ctx) }},
	{"mutex", "Mutex.TryLock", func(ctx context.Context, c *dlock.Client, n string) error { return dropOK(c.Mutex(n).TryLock(ctx)) }},
	{"mutex", "Mutex.Status", func(ctx context.Context, c *dlock.Client, n string) error { return dropOK(c.Mutex(n).Status(ctx)) }},
	{"mutex", "Mutex.ForceUnlock", func(ctx context.Context, c *dlock.Client, n string) error {
		return dropOK(c.Mutex(n).ForceUnlock(ctx))
	}},
	{"reentrant", "ReentrantMutex.Lock", func(ctx context.Context, c *dlock.Client, n string) error {
		return c.ReentrantMutex(n, dlock.WithHandleOwner()).Lock(ctx)
	}},
	{"reentrant", "ReentrantMutex.IsLocked", func(ctx context.Context, c *dlock.Client, n string) error {
		return dropOK(c.ReentrantMutex(n, dlock.WithHandleOwner()).IsLocked(ctx))
	}},
	{"rwmutex", "RWMutex.Lock", func(ctx context.Context, c *dlock.Client, n string) error {
		return c.RWMutex(n, dlock.WithHandleOwner()).Lock(ctx)
	}},
	{"rwmutex", "RWMutex.RLock", func(ctx context.Context, c *dlock.Client, n string) error {
		return c.RWMutex(n, dlock.WithHandleOwner()).RLock(ctx)
	}},
	{"rwmutex", "RWMutex.ForceUnlock", func(ctx context.Context, c *dlock.Client, n string) error {
		return dropOK(c.RWMutex(n, dlock.WithHandleOwner()).ForceUnlock(ctx))
	}},
	{"semaphore", "Semaphore.Acquire", func(ctx context.Context, c *dlock.Client, n string) error {
		return dropOK(c.Semaphore(n).Acquire(ctx, 1))
	}},
	{"semaphore", "Semaphore.SetPermits", func(ctx context.Context, c *dlock.Client, n string) error {
		return c.Semaphore(n).SetPermits(ctx, 5)
	}},
	{"semaphore", "Semaphore.Available", func(ctx context.Context, c *dlock.Client, n string) error {
		return dropOK(c.Semaphore(n).Available(ctx))
	}},
	{"election", "Election.Campaign", func(ctx context.Context, c *dlock.Client, n string) error {
		return c.Election(n).Campaign(ctx, "v")
	}},
	{"election", "Election.Leader", func(ctx context.Context, c *dlock.Client, n string) error {
		return dropOK(c.Election(n).Leader(ctx))
	}},
	{"latch", "CountDownLatch.TrySetCount", func(ctx context.Context, c *dlock.Client, n string) error {
		return dropOK(c.CountDownLatch(n).TrySetCount(ctx, 2))
	}},
	{"latch", "CountDownLatch.CountDown", func(ctx context.Context, c *dlock.Client, n string) error {
		return c.CountDownLatch(n).CountDown(ctx)
	}},
	{"latch", "CountDownLatch.Await", func(ctx context.Context, c *dlock.Client, n string) error {
		return c.CountDownLatch(n).Await(ctx)
	}},
}

// snapshot is every key of a primitive: its DUMP and whether it has an
// expiry, by key.
// refusedNamingKey checks that call, made with bad (a key of lock n)
// holding something of another type (found), fails with ErrInvalid naming
// bad and what it holds, and writes nothing.
func refusedNamingKey(t *testing.T, ctx context.Context, rdb *redis.Client, n, bad, found string, call func() error) {
	t.Helper()
	before := snapshot(t, ctx, rdb, n)
	err := call()
	require.Error(t, err)
	assert.ErrorIs(t, err, dlock.ErrInvalid)
	assert.Contains(t, err.Error(), fmt.Sprintf("%q", bad), "the error names the bad key")
	assert.Contains(t, err.Error(), found)
	assert.Equal(t, before, snapshot(t, ctx, rdb, n), "a refused call wrote")
}

func snapshot(t *testing.T, ctx context.Context, rdb *redis.Client, n string) map[string]string {
	t.Helper()
	keys, err := rdb.Keys(ctx, key(n)+"*").Result()
	require.NoError(t, err)
	out := map[string]string{}
	for _, k := range keys {
		d, err := rdb.Dump(ctx, k).Result()
		require.NoError(t, err)
		ttl, err := rdb.PTTL(ctx, k).Result()
		require.NoError(t, err)
		out[k] = fmt.Sprintf("%x expires=%v", d, ttl >= 0)
	}
	return out
}

// Every primitive refuses a name that another kind holds: at once, with an
// error that names the key and what it holds, and without writing.
//
// It needs a real server: the scripts read another kind's key with
// redis.pcall and classify the WRONGTYPE reply, which miniredis's Lua
// raises differently.
func TestKinds_EveryPairRefusedAtOnceNothingWritten(t *testing.T) {
	e := realEnv(t)
	rdb := e.rdb()
	owner := e.client(rdb)
	c := e.client(e.rdb())
	pairs := 0
	for _, setup := range kindSetups {
		for _, op := range kindOps {
			if setup.kind == op.kind || (op.kind == "rwmutex" && setup.found == "a rwlock") {
				continue
			}
			pairs++
			t.Run(setup.kind+"/"+op.name, func(t *testing.T) {
				ctx := ctxTimeout(t, 10*time.Second)
				n := name(t)
				setup.make(t, ctx, owner, n)
				before := snapshot(t, ctx, rdb, n)
				octx, cancel := context.WithTimeout(ctx, 2*time.Second)
				defer cancel()
				start := time.Now()
				err := op.run(octx, c, n)
				took := time.Since(start)
				require.Error(t, err)
				assert.ErrorIs(t, err, dlock.ErrInvalid)
				assert.False(t, errors.Is(err, context.DeadlineExceeded), "waited instead of refusing: %v", err)
				assert.Less(t, took, 500*time.Millisecond, "not at once")
				assert.Contains(t, err.Error(), fmt.Sprintf("%q", key(n)), "the error names the key")
				assert.Contains(t, err.Error(), setup.found, "the error says what the key holds")
				assert.NotContains(t, err.Error(), "script:", "no script SHA in errors")
				assert.NotContains(t, err.Error(), "user_script", "no script line in errors")
				after := snapshot(t, ctx, rdb, n)
				assert.Equal(t, before, after, "a refused call wrote")
			})
		}
	}
	t.Logf("%d pairs of kinds refused", pairs)
}

// Keys that dlock did not write, at a main key or an auxiliary one, are
// refused the same way.
func TestKinds_ForeignKeysRefusedAtOnceNothingWritten(t *testing.T) {
	e := realEnv(t) // a real server, as above
	rdb := e.rdb()
	c := e.client(e.rdb())
	cases := []struct {
		what   string
		suffix string
		found  string
		put    func(ctx context.Context, k string) error
		ops    []string
	}{
		{"string without expiry at the main key", "", "string", func(ctx context.Context, k string) error { return rdb.Set(ctx, k, "v", 0).Err() },
			[]string{"Mutex.Lock", "ReentrantMutex.Lock", "RWMutex.RLock", "Semaphore.Acquire", "CountDownLatch.Await"}},
		{"user's hash at the main key", "", "hash of another program", func(ctx context.Context, k string) error { return rdb.HSet(ctx, k, "total", "3").Err() },
			[]string{"Mutex.Lock", "ReentrantMutex.Lock", "RWMutex.Lock", "Semaphore.Acquire", "CountDownLatch.TrySetCount"}},
		{"list at the queue key", ":mq", "list", func(ctx context.Context, k string) error { return rdb.RPush(ctx, k, "x").Err() },
			[]string{"Mutex.Lock", "Mutex.TryLock", "ReentrantMutex.Lock", "RWMutex.Lock"}},
		{"string at the read-lease key", ":rl", "string", func(ctx context.Context, k string) error { return rdb.Set(ctx, k, "x", 0).Err() },
			[]string{"RWMutex.RLock", "RWMutex.Lock"}},
		{"set at the permits key", ":h", "set", func(ctx context.Context, k string) error { return rdb.SAdd(ctx, k, "x").Err() },
			[]string{"Semaphore.Acquire", "Semaphore.SetPermits"}},
	}
	ops := map[string]kindOp{}
	for _, op := range kindOps {
		ops[op.name] = op
	}
	for _, tc := range cases {
		for _, opName := range tc.ops {
			t.Run(tc.what+"/"+opName, func(t *testing.T) {
				ctx := ctxTimeout(t, 10*time.Second)
				n := name(t)
				if opName == "Semaphore.Acquire" && tc.suffix == ":h" {
					require.NoError(t, c.Semaphore(n).SetPermits(ctx, 1))
				}
				bad := key(n) + tc.suffix
				require.NoError(t, tc.put(ctx, bad))
				octx, cancel := context.WithTimeout(ctx, 2*time.Second)
				defer cancel()
				refusedNamingKey(t, ctx, rdb, n, bad, tc.found, func() error {
					start := time.Now()
					err := ops[opName].run(octx, c, n)
					assert.Less(t, time.Since(start), 500*time.Millisecond, "not at once")
					return err
				})
			})
		}
	}
}

// A lock's name is free for a lock of any kind as soon as it is released:
// a Mutex, then a ReentrantMutex, an RWMutex and an Election take the same
// name one after another, each at once, each with a token above the one
// before. Readers still keep other kinds out while they hold (see
// TestKinds_EveryPairRefusedAtOnceNothingWritten).
func TestKinds_ReleasedLockName_FreeForEveryLockKind_TokensRising(t *testing.T) {
	e := sharedEnv(t)
	ctx := ctxTimeout(t, 10*time.Second)
	c := e.client(e.rdb())
	n := name(t)
	var last uint64
	step := func(what string, token uint64) {
		t.Helper()
		assert.Greater(t, token, last, "%s: token not above the one before", what)
		last = token
	}
	for round := range 2 {
		m := c.Mutex(n)
		require.NoError(t, m.Lock(ctx), "round %d", round)
		step("mutex", m.Token())
		require.NoError(t, m.Unlock(ctx))

		r := c.ReentrantMutex(n, dlock.WithHandleOwner())
		require.NoError(t, r.Lock(ctx))
		step("reentrant", r.Token(ctx))
		require.NoError(t, r.Unlock(ctx))

		rw := c.RWMutex(n, dlock.WithHandleOwner())
		require.NoError(t, rw.RLock(ctx))
		require.NoError(t, rw.RUnlock(ctx))
		require.NoError(t, rw.Lock(ctx))
		step("rwmutex writer", rw.Token(ctx))
		require.NoError(t, rw.Unlock(ctx))

		el := c.Election(n)
		require.NoError(t, el.Campaign(ctx, "v"))
		step("election", el.Token())
		require.NoError(t, el.Resign(ctx))
	}
	// Released, the name reads as free of any lock kind, with its last token,
	// and as no primitive at all to a reader that expects none in particular.
	_, err := c.Status(ctx, n)
	require.ErrorIs(t, err, dlock.ErrNotFound)
	st, err := c.ReentrantMutex(n).Status(ctx)
	require.NoError(t, err)
	assert.Equal(t, dlock.KindReentrant, st.Kind)
	assert.False(t, st.Held())
	assert.Equal(t, last, st.Token, "the last token, the election's")
}

// A reader that takes over a released lock of another kind keeps its
// highest token (in W while readers hold, and in the token memory): with
// that token far ahead of the clock and the memory expired, the next
// writer's token is still above it.
// And a take-over whose other keys are foreign changes nothing: the
// released lock stays as it was.
func TestKinds_RWMutexTakesOverAReleasedMutex_TokenCarried_ForeignKeysChangeNothing(t *testing.T) {
	e := sharedEnv(t)
	ctx := ctxTimeout(t, 10*time.Second)
	c, rdb := e.client(e.rdb()), e.rdb()
	for _, write := range []bool{false, true} {
		n := name(t)
		m := c.Mutex(n)
		require.NoError(t, m.Lock(ctx))
		require.NoError(t, m.Unlock(ctx))
		last, err := rdb.HGet(ctx, key(n), "f").Uint64()
		require.NoError(t, err)
		ahead := last + uint64(time.Hour/time.Microsecond)
		require.NoError(t, rdb.HSet(ctx, key(n), "f", ahead, "x", 0).Err())
		require.NoError(t, rdb.Del(ctx, key(n)+":f").Err())

		rw := c.RWMutex(n, dlock.WithHandleOwner())
		require.NoError(t, rdb.Set(ctx, key(n)+":rc", "foreign", time.Minute).Err())
		if write {
			err = rw.Lock(ctx)
		} else {
			err = rw.RLock(ctx)
		}
		require.ErrorIs(t, err, dlock.ErrInvalid, "write %v", write)
		assert.Equal(t, "mutex", rdb.HGet(ctx, key(n), "k").Val(), "write %v: the released Mutex was taken over all the same", write)
		require.NoError(t, rdb.Del(ctx, key(n)+":rc").Err())

		if write {
			require.NoError(t, rw.Lock(ctx))
		} else {
			require.NoError(t, rw.RLock(ctx))
			// The token memory expires while the read lasts (past a
			// minute): W keeps the token, as long as a reader holds.
			require.NoError(t, rdb.Del(ctx, key(n)+":f").Err())
			require.NoError(t, rw.RUnlock(ctx))
			require.NoError(t, rw.Lock(ctx))
		}
		assert.Greater(t, rw.Token(ctx), ahead, "write %v: the taken-over lock's token was forgotten", write)
		require.NoError(t, rw.Unlock(ctx))
	}
}

// A released RWMutex whose W kept a queue hint (q), as a release by a
// Client of an earlier version leaves one after a write grant of this
// version, is still a released lock: a Mutex takes the name over, above
// its last token, and the RWMutex's next quiet write grant drops the hint.
func TestKinds_ReleasedRWMutexWithALeftoverQueueHint_IsTakenOver(t *testing.T) {
	e := sharedEnv(t)
	ctx := ctxTimeout(t, 10*time.Second)
	c, rdb := e.client(e.rdb()), e.rdb()
	for _, next := range []string{"mutex", "rwlock"} {
		n := name(t)
		rw := c.RWMutex(n, dlock.WithHandleOwner())
		require.NoError(t, rw.Lock(ctx))
		last := rw.Token(ctx)
		require.NoError(t, rw.Unlock(ctx))
		require.NoError(t, rdb.HSet(ctx, key(n), "q", "1").Err()) // what an earlier version's release leaves
		if next == "mutex" {
			m := c.Mutex(n)
			ok, err := m.TryLock(ctx)
			require.NoError(t, err)
			require.True(t, ok, "the released RWMutex was not taken over")
			assert.Greater(t, m.Token(), last)
			require.NoError(t, m.Unlock(ctx))
			continue
		}
		require.NoError(t, rw.Lock(ctx))
		assert.Greater(t, rw.Token(ctx), last)
		assert.Zero(t, rdb.HExists(ctx, key(n), "q").Val(), "a quiet write grant kept the hint")
		require.NoError(t, rw.Unlock(ctx))
	}
}
