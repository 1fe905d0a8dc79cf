// Command quickstart shows dlock at work and prints what it measured:
// several Clients (standing in for separate processes) contend for one Mutex
// around a counter that only a working lock keeps exact; nested calls re-enter
// a ReentrantMutex; and an uncontended Lock+Unlock is counted in round trips.
//
//	go run ./examples/quickstart                                  # embedded Redis
//	go run ./examples/quickstart -redis redis://127.0.0.1:6379/0  # a real server
//	REDIS_URL=redis://127.0.0.1:6379/0 go run ./examples/quickstart
package main

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/embedded"
)

func main() {
	url := flag.String("redis", os.Getenv("REDIS_URL"), "Redis URL; empty runs an embedded Redis (miniredis)")
	clients := flag.Int("clients", 3, "Clients contending, each standing in for a process")
	workers := flag.Int("workers", 4, "goroutines per Client")
	rounds := flag.Int("rounds", 50, "lock acquisitions per goroutine")
	flag.Parse()
	if err := run(*url, *clients, *workers, *rounds); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func run(url string, clients, workers, rounds int) error {
	opts, where, stop, err := connect(url)
	if err != nil {
		return err
	}
	defer stop()
	fmt.Println("Redis:", where)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	run := rand.Text()[:8] // keeps this run's keys apart from earlier runs

	if err := contend(ctx, opts, run, clients, workers, rounds); err != nil {
		return err
	}
	if err := nested(ctx, opts, run); err != nil {
		return err
	}
	return cost(ctx, opts, run)
}

func connect(url string) (*redis.Options, string, func(), error) {
	if url == "" {
		// A miniredis whose clock follows the wall clock, so that leases
		// run out as on a real server.
		mr, err := embedded.Start("")
		if err != nil {
			return nil, "", nil, err
		}
		return &redis.Options{Addr: mr.Addr()}, "embedded miniredis at " + mr.Addr() + " (pass -redis or REDIS_URL for a real server)", mr.Close, nil
	}
	opts, err := redis.ParseURL(url)
	if err != nil {
		return nil, "", nil, err
	}
	return opts, opts.Addr, func() {}, nil
}

// contend runs clients×workers goroutines that each increment a counter in
// Redis with a non-atomic GET then SET, under one Mutex.
func contend(ctx context.Context, opts *redis.Options, run string, clients, workers, rounds int) error {
	fmt.Printf("\n1. Mutual exclusion: %d clients x %d goroutines x %d rounds on one Mutex\n", clients, workers, rounds)
	lockName, counterKey := "quickstart:"+run, "quickstart:"+run+":counter"
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		waits    []time.Duration
		firstErr atomic.Value
	)
	start := time.Now()
	for range clients {
		rdb := redis.NewClient(opts)
		defer rdb.Close()
		c := dlock.New(rdb)
		defer c.Close()
		for range workers {
			m := c.Mutex(lockName) // goroutines may also share one handle, like sync.Mutex
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range rounds {
					t0 := time.Now()
					if err := m.Lock(ctx); err != nil {
						firstErr.CompareAndSwap(nil, err)
						return
					}
					waited := time.Since(t0)
					v, err := rdb.Get(ctx, counterKey).Int()
					if err == nil || errors.Is(err, redis.Nil) {
						err = rdb.Set(ctx, counterKey, v+1, time.Hour).Err()
					}
					if uerr := m.Unlock(ctx); err == nil {
						err = uerr
					}
					if err != nil {
						firstErr.CompareAndSwap(nil, err)
						return
					}
					mu.Lock()
					waits = append(waits, waited)
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err, _ := firstErr.Load().(error); err != nil {
		return err
	}
	check := redis.NewClient(opts)
	defer check.Close()
	got, err := check.Get(ctx, counterKey).Int()
	if err != nil {
		return err
	}
	want := clients * workers * rounds
	slices.Sort(waits)
	pct := func(p int) time.Duration { return waits[(len(waits)-1)*p/100] }
	fmt.Printf("   counter = %d, expected %d: %s\n", got, want, map[bool]string{true: "no lost updates", false: "LOST UPDATES"}[got == want])
	fmt.Printf("   %d acquisitions in %v (%.0f/s); wait p50 %v, p99 %v, max %v\n",
		len(waits), elapsed.Round(time.Millisecond), float64(len(waits))/elapsed.Seconds(),
		pct(50).Round(time.Microsecond), pct(99).Round(time.Microsecond), pct(100).Round(time.Microsecond))
	if got != want {
		return fmt.Errorf("counter %d, want %d", got, want)
	}
	return nil
}

// nested shows re-entry: transfer holds the account lock and calls audit,
// which takes it again with the same owner, carried in the context.
func nested(ctx context.Context, opts *redis.Options, run string) error {
	fmt.Println("\n2. Reentrancy: transfer() holds the lock and calls audit(), which locks it again")
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	c := dlock.New(rdb)
	defer c.Close()
	account := c.ReentrantMutex("quickstart:" + run + ":account")

	audit := func(ctx context.Context) error {
		if err := account.Lock(ctx); err != nil {
			return err
		}
		defer account.Unlock(ctx)
		n, err := account.HoldCount(ctx)
		fmt.Printf("   audit:    hold count %d\n", n)
		return err
	}
	ctx = dlock.WithNewOwner(ctx) // one owner per request
	if err := account.Lock(ctx); err != nil {
		return err
	}
	n, err := account.HoldCount(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("   transfer: hold count %d\n", n)
	if err := audit(ctx); err != nil {
		return err
	}
	other := dlock.WithNewOwner(context.Background())
	ok, err := account.TryLock(other)
	if err != nil {
		return err
	}
	fmt.Printf("   another request's TryLock meanwhile: %v\n", ok)
	if err := account.Unlock(ctx); err != nil {
		return err
	}
	locked, err := account.IsLocked(ctx)
	fmt.Printf("   after transfer's Unlock, locked: %v\n", locked)
	return err
}

// cost counts the round trips of uncontended Lock+Unlock pairs.
func cost(ctx context.Context, opts *redis.Options, run string) error {
	fmt.Println("\n3. Cost of an uncontended Lock+Unlock")
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	trips := &tripCounter{}
	rdb.AddHook(trips)
	c := dlock.New(rdb)
	defer c.Close()
	m := c.Mutex("quickstart:" + run + ":solo")
	const pairs = 1000
	start := time.Now()
	for range pairs {
		if err := m.Lock(ctx); err != nil {
			return err
		}
		if err := m.Unlock(ctx); err != nil {
			return err
		}
	}
	elapsed := time.Since(start)
	fmt.Printf("   %d pairs: %.2f round trips per pair, %v per pair\n",
		pairs, float64(trips.n.Load())/pairs, (elapsed / pairs).Round(time.Microsecond))
	return nil
}

// tripCounter is a go-redis hook counting round trips (commands or pipelines).
type tripCounter struct{ n atomic.Int64 }

func (t *tripCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (t *tripCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		t.n.Add(1)
		return next(ctx, cmd)
	}
}

func (t *tripCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		t.n.Add(1)
		return next(ctx, cmds)
	}
}
