package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
)

// embedded starts an in-process Redis for the examples; in production, pass
// your own go-redis client.
func embedded() (*redis.Client, func()) {
	mr, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	return rdb, func() { _ = rdb.Close(); mr.Close() }
}

func ExampleMutex() {
	rdb, stop := embedded()
	defer stop()
	c := dlock.New(rdb)
	defer c.Close()

	ctx := context.Background()
	m := c.Mutex("orders:42")
	if err := m.Lock(ctx); err != nil {
		fmt.Println("lock:", err)
		return
	}
	fmt.Println("holding", m.Name())
	if err := m.Unlock(ctx); err != nil {
		fmt.Println("unlock:", err)
	}
	fmt.Println(errors.Is(m.Unlock(ctx), dlock.ErrNotHeld))
	// Output:
	// holding orders:42
	// true
}

func ExampleMutex_TryLock() {
	rdb, stop := embedded()
	defer stop()
	a, b := dlock.New(rdb), dlock.New(rdb) // think: two processes
	defer a.Close()
	defer b.Close()

	ctx := context.Background()
	ok, _ := a.Mutex("report").TryLock(ctx)
	fmt.Println("a got it:", ok)
	ok, err := b.Mutex("report").TryLock(ctx)
	fmt.Println("b got it:", ok, err)
	// Output:
	// a got it: true
	// b got it: false <nil>
}

func ExampleMutex_Lock_timeout() {
	rdb, stop := embedded()
	defer stop()
	a, b := dlock.New(rdb), dlock.New(rdb)
	defer a.Close()
	defer b.Close()

	_ = a.Mutex("invoice").Lock(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := b.Mutex("invoice").Lock(ctx)
	fmt.Println(errors.Is(err, dlock.ErrNotObtained), errors.Is(err, context.DeadlineExceeded))
	// Output:
	// true true
}

func ExampleReentrantMutex() {
	rdb, stop := embedded()
	defer stop()
	c := dlock.New(rdb)
	defer c.Close()

	account := c.ReentrantMutex("account:7")
	audit := func(ctx context.Context) {
		// Nested code takes the same lock again: it passes the same owner.
		_ = account.Lock(ctx)
		defer account.Unlock(ctx)
		n, _ := account.HoldCount(ctx)
		fmt.Println("audit holds", n)
	}

	ctx := dlock.WithNewOwner(context.Background()) // e.g. one owner per request
	_ = account.Lock(ctx)
	audit(ctx)
	n, _ := account.HoldCount(ctx)
	fmt.Println("transfer holds", n)
	_ = account.Unlock(ctx)
	locked, _ := account.IsLocked(ctx)
	fmt.Println("locked after the last Unlock:", locked)
	// Output:
	// audit holds 2
	// transfer holds 1
	// locked after the last Unlock: false
}

func ExampleMutex_HoldContext() {
	rdb, stop := embedded()
	defer stop()
	c := dlock.New(rdb, dlock.WithWatchdogTimeout(300*time.Millisecond))
	defer c.Close()

	ctx := context.Background()
	m := c.Mutex("nightly-job")
	_ = m.Lock(ctx)
	work, done := m.HoldContext(ctx)
	defer done()

	rdb.Del(ctx, "dlock:{nightly-job}") // an operator deletes the lock

	<-work.Done() // the next renewal finds the hold gone
	fmt.Println(errors.Is(context.Cause(work), dlock.ErrLost))
	fmt.Println(errors.Is(m.Unlock(ctx), dlock.ErrLost))
	// Output:
	// true
	// true
}

func ExampleRWMutex() {
	rdb, stop := embedded()
	defer stop()
	c := dlock.New(rdb)
	defer c.Close()
	ctx := context.Background()

	catalog := c.RWMutex("catalog")
	reader1 := dlock.WithNewOwner(ctx)
	reader2 := dlock.WithNewOwner(ctx)
	_ = catalog.RLock(reader1)
	ok, _ := catalog.TryRLock(reader2)
	fmt.Println("second reader:", ok)
	ok, _ = catalog.TryLock(dlock.WithNewOwner(ctx))
	fmt.Println("writer while reading:", ok)
	fmt.Println(errors.Is(catalog.Lock(reader1), dlock.ErrUpgrade))
	_ = catalog.RUnlock(reader1)
	_ = catalog.RUnlock(reader2)
	// Output:
	// second reader: true
	// writer while reading: false
	// true
}

func ExampleSemaphore() {
	rdb, stop := embedded()
	defer stop()
	c := dlock.New(rdb)
	defer c.Close()
	ctx := context.Background()

	slots := c.Semaphore("gpu-slots")
	_, _ = slots.TrySetPermits(ctx, 4)
	p, _ := slots.Acquire(ctx, 3)
	free, _ := slots.Available(ctx)
	fmt.Println("free while holding 3:", free)
	_, err := slots.TryAcquire(ctx, 2)
	fmt.Println(errors.Is(err, dlock.ErrNotObtained))
	_ = p.Release(ctx)
	fmt.Println(errors.Is(p.Release(ctx), dlock.ErrNotHeld))
	free, _ = slots.Available(ctx)
	fmt.Println("free after release:", free)
	// Output:
	// free while holding 3: 1
	// true
	// true
	// free after release: 4
}

func ExampleCountDownLatch() {
	rdb, stop := embedded()
	defer stop()
	c := dlock.New(rdb)
	defer c.Close()
	ctx := context.Background()

	batch := c.CountDownLatch("batch-7")
	_, _ = batch.TrySetCount(ctx, 3)
	done := make(chan struct{})
	go func() {
		_ = batch.Await(ctx)
		close(done)
	}()
	for range 3 {
		_ = batch.CountDown(ctx)
	}
	<-done
	n, _ := batch.Count(ctx)
	fmt.Println("count:", n)
	// Output:
	// count: 0
}
