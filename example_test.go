package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/fence"
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

// Every hold has a fencing token: pass it with the writes the lock protects,
// so that the resource can refuse a holder that lost the lock (see package
// fence).
func ExampleMutex_Token() {
	rdb, stop := embedded()
	defer stop()
	c := dlock.New(rdb)
	defer c.Close()
	ctx := context.Background()

	m := c.Mutex("invoice:42")
	fmt.Println("not held:", m.Token())
	if err := m.Lock(ctx); err != nil {
		panic(err)
	}
	first := m.Token()
	_ = m.Unlock(ctx)

	other := c.Mutex("invoice:42") // another handle, or another process
	if err := other.Lock(ctx); err != nil {
		panic(err)
	}
	defer other.Unlock(ctx)
	fmt.Println("a later hold's token is greater:", first > 0 && other.Token() > first)
	// Output:
	// not held: 0
	// a later hold's token is greater: true
}

// Extend sets when a hold ends: here a fixed lease, lengthened while the
// work runs long.
func ExampleMutex_Extend() {
	rdb, stop := embedded()
	defer stop()
	c := dlock.New(rdb)
	defer c.Close()
	ctx := context.Background()

	m := c.Mutex("export", dlock.WithLease(time.Second))
	if err := m.Lock(ctx); err != nil {
		panic(err)
	}
	if err := m.Extend(ctx, time.Minute); err != nil {
		fmt.Println("extend:", err)
	}
	left, _ := m.TTL(ctx)
	fmt.Println("more than the first lease left:", left > time.Second)
	_ = m.Unlock(ctx)
	fmt.Println(errors.Is(m.Extend(ctx, time.Minute), dlock.ErrNotHeld))
	// Output:
	// more than the first lease left: true
	// true
}

// Status shows operators who holds a lock and how many wait, from any
// Client.
func ExampleMutex_Status() {
	rdb, stop := embedded()
	defer stop()
	worker := dlock.New(rdb, dlock.WithClientName("worker-1"))
	defer worker.Close()
	ops := dlock.New(rdb)
	defer ops.Close()
	ctx := context.Background()

	m := worker.Mutex("reindex")
	_ = m.Lock(ctx)
	st, err := ops.Status(ctx, "reindex") // or ops.Mutex("reindex").Status(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println(st.Kind, st.Held(), st.Holders[0].Client, st.Waiting, st.Token == m.Token())
	_ = m.Unlock(ctx)
	st, _ = ops.Status(ctx, "reindex")
	fmt.Println("held after Unlock:", st.Held())
	// Output:
	// mutex true worker-1 0 true
	// held after Unlock: false
}

// A MultiLock takes several locks, all or none, in name order, so that
// callers listing the names in any order never deadlock.
func ExampleMultiLock() {
	rdb, stop := embedded()
	defer stop()
	a, b := dlock.New(rdb), dlock.New(rdb)
	defer a.Close()
	defer b.Close()
	ctx := context.Background()

	transfer := a.MultiLock([]string{"account:2", "account:1"})
	if err := transfer.Lock(ctx); err != nil {
		panic(err)
	}
	fmt.Println(transfer.Names())
	audit := b.MultiLock([]string{"account:3", "account:1"})
	ok, _ := audit.TryLock(ctx)
	fmt.Println("audit while transferring:", ok)
	locked, _ := b.Mutex("account:3").IsLocked(ctx)
	fmt.Println("account:3 left locked:", locked)
	_ = transfer.Unlock(ctx)
	ok, _ = audit.TryLock(ctx)
	fmt.Println("audit after:", ok)
	_ = audit.Unlock(ctx)
	// Output:
	// [account:1 account:2]
	// audit while transferring: false
	// account:3 left locked: false
	// audit after: true
}

func ExampleElection() {
	rdb, stop := embedded()
	defer stop()
	a, b := dlock.New(rdb), dlock.New(rdb) // think: two replicas of a service
	defer a.Close()
	defer b.Close()
	ctx := context.Background()

	ea, eb := a.Election("scheduler"), b.Election("scheduler")
	if err := ea.Campaign(ctx, "node-a"); err != nil {
		panic(err)
	}
	leader, _ := eb.Leader(ctx)
	fmt.Println("leader:", leader)

	elected := make(chan struct{})
	go func() {
		defer close(elected)
		_ = eb.Campaign(ctx, "node-b") // blocks while node-a leads
	}()
	_ = ea.Resign(ctx)
	<-elected
	leader, _ = ea.Leader(ctx)
	fmt.Println("leader:", leader)
	_ = eb.Resign(ctx)
	_, err := ea.Leader(ctx)
	fmt.Println(errors.Is(err, dlock.ErrNoLeader))
	// Output:
	// leader: node-a
	// leader: node-b
	// true
}

// A hold handed over as text is released (or extended) by another process.
func ExampleMutex_HandOver() {
	rdb, stop := embedded()
	defer stop()
	scheduler, worker := dlock.New(rdb), dlock.New(rdb)
	defer scheduler.Close()
	defer worker.Close()
	ctx := context.Background()

	m := scheduler.Mutex("batch-9")
	_ = m.Lock(ctx)
	ref, err := m.HandOver() // the worker is now responsible for the hold
	if err != nil {
		panic(err)
	}
	text := ref.String() // sent along with the job

	r, err := dlock.ParseHoldRef(text)
	if err != nil {
		panic(err)
	}
	fmt.Println(worker.ExtendRef(ctx, r, time.Minute))
	fmt.Println(worker.ReleaseRef(ctx, r))
	fmt.Println(errors.Is(worker.ReleaseRef(ctx, r), dlock.ErrNotHeld))
	// Output:
	// <nil>
	// <nil>
	// true
}

// Locker adapts a Mutex to code that takes a sync.Locker; its methods panic
// on errors.
func ExampleMutex_Locker() {
	rdb, stop := embedded()
	defer stop()
	c := dlock.New(rdb)
	defer c.Close()

	var l sync.Locker = c.Mutex("legacy-job").Locker()
	l.Lock()
	fmt.Println("locked")
	l.Unlock()
	// Output:
	// locked
}

// A Mutex handle shared by goroutines hands the lock on to the ones waiting
// on it, in-process, a bounded number of times per grant from Redis (lock
// cohorting, on by default; WithoutCohort turns it off). Each hold still has
// a fencing token of its own, reserved by the grant.
func ExampleWithCohort() {
	rdb, stop := embedded()
	defer stop()
	c := dlock.New(rdb)
	defer c.Close()

	ctx := context.Background()
	m := c.Mutex("jobs", dlock.WithCohort(8, time.Second)) // up to 8 local handoffs, within a second of the grant
	if err := m.Lock(ctx); err != nil {
		fmt.Println("lock:", err)
		return
	}
	first := m.Token()
	next := make(chan uint64)
	go func() {
		if err := m.Lock(ctx); err != nil { // waits on the handle, sending nothing to Redis
			fmt.Println("lock:", err)
			next <- 0
			return
		}
		tok := m.Token()
		_ = m.Unlock(ctx)
		next <- tok
	}()
	time.Sleep(50 * time.Millisecond)
	_ = m.Unlock(ctx) // hands the hold to the goroutine
	fmt.Println("handed on with the next token:", <-next == first+1)
	// Output:
	// handed on with the next token: true
}

// The README's example: a Mutex whose hold guards a fenced write. In the
// README, main connects to a Redis server and calls sendInvoice.
func Example_fencedWrite() {
	rdb, stop := embedded()
	defer stop()
	if err := sendInvoice(context.Background(), rdb); err != nil {
		fmt.Println(err)
	}
	// Output:
	// invoice 42 sent
}

// sendInvoice marks invoice 42 sent; any number of processes may run it.
func sendInvoice(ctx context.Context, rdb *redis.Client) error {
	c := dlock.New(rdb) // one Client per process, shared by its goroutines
	defer c.Close()

	m := c.Mutex("invoice:42")
	if err := m.Lock(ctx); err != nil { // blocks until held, or until ctx ends
		return err
	}
	defer m.Unlock(ctx)

	// work is cancelled if the hold is lost (renewals failed for a lease,
	// the key was deleted): stop touching what the lock protects then.
	work, done := m.HoldContext(ctx)
	defer done()

	// A holder that paused past its lease may still get here. The guard
	// refuses its write (fence.ErrStale) once a later holder has written.
	g := fence.NewRedis(rdb)
	if err := g.Set(work, "invoice:42:status", m.Token(), "sent", 0); err != nil {
		return err
	}
	fmt.Println("invoice 42 sent")
	return nil
}
