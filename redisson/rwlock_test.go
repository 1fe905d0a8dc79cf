package redisson_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock"
)

const rwCh = "redisson_rwlock:{cfg}"

func TestReadWriteLock_GoAndJavaReadersShare_WritersWait(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ctx := ctxT(t, 10*time.Second)
	g := owner(ctx, "job-1")
	rw := e.go_.ReadWriteLock("cfg")
	require.NoError(t, rw.RLock(g))
	ok, err := e.java.TryReadLock(ctx, "cfg", 7, 0)
	require.NoError(t, err)
	require.True(t, ok, "a Java reader joins a Go reader")
	ok, err = e.java.TryWriteLock(ctx, "cfg", 8, 0)
	require.NoError(t, err)
	assert.False(t, ok, "a Java writer while Go reads")
	ok, err = e.go_.ReadWriteLock("cfg").TryLock(owner(ctx, "job-2"))
	require.NoError(t, err)
	assert.False(t, ok, "a Go writer while Java reads")

	// Go's read hold has its own key, named as Java's read unlock expects.
	field := e.go_.ID() + ":" + "goField"
	h, err := e.rdb.HGetAll(ctx, "cfg").Result()
	require.NoError(t, err)
	assert.Equal(t, "read", h["mode"])
	for f := range h {
		if f != "mode" && f != e.java.Field(7) {
			field = f
		}
	}
	fieldOK(t, field, e.go_.ID())
	ttl, err := e.rdb.PTTL(ctx, "{cfg}:"+field+":rwlock_timeout:1").Result()
	require.NoError(t, err)
	assert.InDelta(t, 30*time.Second, ttl, float64(2*time.Second))
	mode, err := rw.Mode(ctx)
	require.NoError(t, err)
	assert.Equal(t, "read", mode)

	require.NoError(t, rw.RUnlock(g))
	require.NoError(t, e.java.ReadUnlock(ctx, "cfg", 7))
	mode, err = rw.Mode(ctx)
	require.NoError(t, err)
	assert.Empty(t, mode)
}

func TestReadWriteLock_JavaReadUnlock_KeepsTheLockForGosReadHold(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ctx := ctxT(t, 10*time.Second)
	g := owner(ctx, "job-1")
	rw := e.go_.ReadWriteLock("cfg")
	require.NoError(t, rw.RLock(g)) // a 30 s watchdog lease
	require.NoError(t, e.java.ReadLock(ctx, "cfg", 7, 2*time.Second))
	// Java's read unlock sets the hash's TTL to the longest read hold it
	// finds, Go's included: had Go not written its hold key, it would have
	// deleted the lock under Go's reader.
	require.NoError(t, e.java.ReadUnlock(ctx, "cfg", 7))
	ttl, err := e.rdb.PTTL(ctx, "cfg").Result()
	require.NoError(t, err)
	assert.Greater(t, ttl, 25*time.Second)
	ok, err := e.java.TryWriteLock(ctx, "cfg", 8, 0)
	require.NoError(t, err)
	assert.False(t, ok)
	require.NoError(t, rw.RUnlock(g))
	ok, err = e.java.TryWriteLock(ctx, "cfg", 8, 0)
	require.NoError(t, err)
	assert.True(t, ok)
	require.NoError(t, e.java.WriteUnlock(ctx, "cfg", 8))
}

func TestReadWriteLock_GoWriteUnlock_WakesEveryJavaReader(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ctx := ctxT(t, 20*time.Second)
	g := owner(ctx, "job-1")
	rw := e.go_.ReadWriteLock("cfg").WithLease(15 * time.Second)
	require.NoError(t, rw.Lock(g))
	r1 := result(func() error { return e.java.ReadLock(ctx, "cfg", 7, 0) })
	r2 := result(func() error { return e.java.ReadLock(ctx, "cfg", 8, 0) })
	awaitSubscribers(t, e.rdb, rwCh, 2)
	notYet(t, r1, 100*time.Millisecond)
	require.NoError(t, rw.Unlock(g))
	for _, r := range []timed{recv(t, r1, 3*time.Second), recv(t, r2, 3*time.Second)} {
		require.NoError(t, r.err)
		assert.Less(t, r.took, 3*time.Second, "woken by the write unlock's message")
	}
	require.NoError(t, e.java.ReadUnlock(ctx, "cfg", 7))
	require.NoError(t, e.java.ReadUnlock(ctx, "cfg", 8))
}

func TestReadWriteLock_GoReadUnlock_WakesJavaWriter_AndBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ctx := ctxT(t, 20*time.Second)
	g := owner(ctx, "job-1")
	rw := e.go_.ReadWriteLock("cfg").WithLease(15 * time.Second)
	require.NoError(t, rw.RLock(g))
	w := result(func() error { return e.java.WriteLock(ctx, "cfg", 7, 15*time.Second) })
	awaitSubscribers(t, e.rdb, rwCh, 1)
	require.NoError(t, rw.RUnlock(g))
	r := recv(t, w, 3*time.Second)
	require.NoError(t, r.err)
	// Now Go waits for Java's write unlock.
	gr := result(func() error { return rw.RLock(g) })
	awaitSubscribers(t, e.rdb, rwCh, 1)
	notYet(t, gr, 100*time.Millisecond)
	require.NoError(t, e.java.WriteUnlock(ctx, "cfg", 7))
	r = recv(t, gr, 3*time.Second)
	require.NoError(t, r.err)
	require.NoError(t, rw.RUnlock(g))
}

func TestReadWriteLock_Downgrade_And_NoUpgrade(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ctx := ctxT(t, 10*time.Second)
	g := owner(ctx, "job-1")
	rw := e.go_.ReadWriteLock("cfg")
	require.NoError(t, rw.Lock(g))
	require.NoError(t, rw.RLock(g), "a writer takes read holds")
	require.NoError(t, rw.Unlock(g))
	mode, err := rw.Mode(ctx)
	require.NoError(t, err)
	assert.Equal(t, "read", mode, "the write unlock left the owner's read hold")
	ok, err := e.java.TryWriteLock(ctx, "cfg", 7, 0)
	require.NoError(t, err)
	assert.False(t, ok)
	ok, err = e.java.TryReadLock(ctx, "cfg", 7, 0)
	require.NoError(t, err)
	assert.True(t, ok)
	require.NoError(t, e.java.ReadUnlock(ctx, "cfg", 7))
	ok, err = rw.TryLock(g)
	require.NoError(t, err)
	assert.False(t, ok, "no upgrade")
	assert.ErrorIs(t, rw.Unlock(g), dlock.ErrNotHeld)
	require.NoError(t, rw.RUnlock(g))
	assert.ErrorIs(t, rw.RUnlock(g), dlock.ErrNotHeld)
}

func TestReadWriteLock_MixedContention_KeepsTheInvariant(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ctx := ctxT(t, 30*time.Second)
	var readers, writers atomic.Int32
	var bad atomic.Bool
	check := func(write bool) {
		if write {
			if writers.Add(1) != 1 || readers.Load() != 0 {
				bad.Store(true)
			}
		} else {
			readers.Add(1)
			if writers.Load() != 0 {
				bad.Store(true)
			}
		}
		time.Sleep(2 * time.Millisecond)
		if write {
			writers.Add(-1)
		} else {
			readers.Add(-1)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 2 {
		for _, write := range []bool{false, true} {
			wg.Add(2)
			go func() {
				defer wg.Done()
				rw := e.go_.ReadWriteLock("cfg")
				g := owner(ctx, "go-"+string(rune('a'+w))+map[bool]string{true: "w", false: "r"}[write])
				for range 8 {
					lock, unlock := rw.RLock, rw.RUnlock
					if write {
						lock, unlock = rw.Lock, rw.Unlock
					}
					if err := lock(g); err != nil {
						errs <- err
						return
					}
					check(write)
					if err := unlock(g); err != nil {
						errs <- err
						return
					}
				}
			}()
			go func() {
				defer wg.Done()
				tid := int64(20 + 2*w)
				if write {
					tid++
				}
				for range 8 {
					var err error
					if write {
						err = e.java.WriteLock(ctx, "cfg", tid, 0)
					} else {
						err = e.java.ReadLock(ctx, "cfg", tid, 0)
					}
					if err != nil {
						errs <- err
						return
					}
					check(write)
					if write {
						err = e.java.WriteUnlock(ctx, "cfg", tid)
					} else {
						err = e.java.ReadUnlock(ctx, "cfg", tid)
					}
					if err != nil {
						errs <- err
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	assert.False(t, bad.Load(), "a writer overlapped another holder")
	n, err := e.rdb.Exists(ctx, "cfg").Result()
	require.NoError(t, err)
	assert.Zero(t, n, "the lock is free at the end")
}

func TestReadWriteLock_ReadWatchdog_RenewsHoldKeys(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 600*time.Millisecond)
	ctx := ctxT(t, 10*time.Second)
	g := owner(ctx, "job-1")
	rw := e.go_.ReadWriteLock("cfg")
	require.NoError(t, rw.RLock(g))
	require.NoError(t, e.java.ReadLock(ctx, "cfg", 7, 0))
	time.Sleep(1500 * time.Millisecond)
	ok, err := e.java.TryWriteLock(ctx, "cfg", 8, 0)
	require.NoError(t, err)
	assert.False(t, ok, "the readers' holds expired")
	// Java's unlock computes the lock's life from Go's renewed hold key.
	require.NoError(t, e.java.ReadUnlock(ctx, "cfg", 7))
	n, err := e.rdb.Exists(ctx, "cfg").Result()
	require.NoError(t, err)
	assert.Equal(t, int64(1), n, "Java's read unlock deleted the lock under Go's reader")
	select {
	case <-rw.RLost(g):
		t.Fatal("the renewed read hold was reported lost")
	default:
	}
	require.NoError(t, rw.RUnlock(g))
}

func TestReadWriteLock_ForceUnlock_FromJavaRLockName_IsRefusedByLock(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 0)
	ctx := ctxT(t, 10*time.Second)
	require.NoError(t, e.java.Lock(ctx, "plain", 7, time.Minute))
	_, err := e.go_.ReadWriteLock("plain").TryRLock(owner(ctx, "job-1"))
	assert.ErrorIs(t, err, dlock.ErrInvalid, "an RLock hash is no read-write lock")
	_, err = e.go_.ReadWriteLock("plain").TryLock(owner(ctx, "job-1"))
	assert.ErrorIs(t, err, dlock.ErrInvalid)
	n, err := e.java.HoldCount(ctx, "plain", 7)
	require.NoError(t, err)
	assert.Equal(t, 1, n)

	require.NoError(t, e.java.WriteLock(ctx, "cfg", 7, 0))
	ok, err := e.go_.ReadWriteLock("cfg").ForceUnlock(ctx)
	require.NoError(t, err)
	assert.True(t, ok)
	assert.ErrorIs(t, e.java.WriteUnlock(ctx, "cfg", 7), javapeerIMSE)
}
