package redisson_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redisson"
)

// embedded starts an in-process Redis for the examples; in production, pass
// the go-redis client of the Redis your Java services' Redisson uses.
func embedded() (*redis.Client, func()) {
	mr, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	return rdb, func() { _ = rdb.Close(); mr.Close() }
}

// A Go service takes the lock a Java service takes with
// redisson.getLock("orders:42").lock().
func ExampleLock() {
	rdb, stop := embedded()
	defer stop()
	c := redisson.New(rdb)
	defer c.Close()

	// One owner per unit of work: its calls re-enter, others wait.
	ctx := dlock.WithNewOwner(context.Background())
	l := c.Lock("orders:42")
	if err := l.Lock(ctx); err != nil {
		fmt.Println("lock:", err)
		return
	}
	_ = l.Lock(ctx) // re-entry, as a Java thread may
	n, _ := l.HoldCount(ctx)
	fmt.Println("holds:", n)

	other := dlock.WithNewOwner(context.Background())
	ok, _ := l.TryLock(other)
	fmt.Println("another owner got it:", ok)

	_ = l.Unlock(ctx)
	_ = l.Unlock(ctx) // the last one publishes Redisson's unlock message
	fmt.Println(errors.Is(l.Unlock(ctx), dlock.ErrNotHeld))
	// Output:
	// holds: 2
	// another owner got it: false
	// true
}

// Tokens of an RFencedLock rise across every Go and Java holder.
func ExampleFencedLock() {
	rdb, stop := embedded()
	defer stop()
	c := redisson.New(rdb)
	defer c.Close()

	ctx := dlock.WithNewOwner(context.Background())
	f := c.FencedLock("ledger")
	t1, _ := f.Lock(ctx)
	_ = f.Unlock(ctx)
	t2, _ := f.Lock(ctx)
	_ = f.Unlock(ctx)
	fmt.Println(t1, t2)
	// Output:
	// 1 2
}

func ExampleReadWriteLock() {
	rdb, stop := embedded()
	defer stop()
	c := redisson.New(rdb)
	defer c.Close()

	reader, writer := dlock.WithNewOwner(context.Background()), dlock.WithNewOwner(context.Background())
	rw := c.ReadWriteLock("config")
	_ = rw.RLock(reader)
	ok, _ := rw.TryLock(writer)
	mode, _ := rw.Mode(reader)
	fmt.Println(mode, ok)
	_ = rw.RUnlock(reader)
	ok, _ = rw.TryLock(writer)
	mode, _ = rw.Mode(writer)
	fmt.Println(mode, ok)
	_ = rw.Unlock(writer)
	// Output:
	// read false
	// write true
}

func ExampleSemaphore() {
	rdb, stop := embedded()
	defer stop()
	c := redisson.New(rdb)
	defer c.Close()

	ctx := context.Background()
	s := c.Semaphore("connections")
	_, _ = s.TrySetPermits(ctx, 2)
	_ = s.Acquire(ctx, 2)
	ok, _ := s.TryAcquire(ctx, 1)
	fmt.Println("third:", ok)
	_ = s.Release(ctx, 1) // wakes Java and Go acquirers
	n, _ := s.AvailablePermits(ctx)
	fmt.Println("available:", n)
	// Output:
	// third: false
	// available: 1
}
