package main

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
)

// Scale figures, dlock only: many holds renewed by one watchdog, and many
// waiters blocked through one Client.
type scaleResult struct {
	holds          int
	period         time.Duration
	periods        int
	renewTrips     int // round trips the watchdog sent over periods
	renewCalls     int // renewal script calls over periods
	heapPerHold    float64
	waiters, keys  int
	pubsubConns    int
	heapPerWaiter  float64
	stackPerWaiter float64
	served         time.Duration
	err            errBox
}

// tripCounter is a go-redis hook counting round trips (a command or a
// pipeline) and the commands in them.
type tripCounter struct{ trips, cmds atomic.Int64 }

func (c *tripCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *tripCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.trips.Add(1)
		c.cmds.Add(1)
		return next(ctx, cmd)
	}
}

func (c *tripCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.trips.Add(1)
		c.cmds.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// afterRound returns once the counter has moved and then kept still for
// 100ms: a renewal round just ended. It gives up after limit.
func afterRound(cnt *tripCounter, limit time.Duration) {
	end := time.Now().Add(limit)
	seen, last := cnt.trips.Load(), time.Time{}
	for time.Now().Before(end) {
		time.Sleep(10 * time.Millisecond)
		if n := cnt.trips.Load(); n != seen {
			seen, last = n, time.Now()
		} else if !last.IsZero() && time.Since(last) > 100*time.Millisecond {
			return
		}
	}
}

// heap returns the live heap and stack in use after a full collection.
func heap() (heapBytes, stackBytes uint64) {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc, ms.StackInuse
}

// parallel runs f(i) for i in [0, n) on workers goroutines.
func parallel(n, workers int, f func(i int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				f(i)
			}
		})
	}
	wg.Wait()
}

func runScale(addr string, holds, waiters, keys int) *scaleResult {
	res := &scaleResult{holds: holds, waiters: waiters, keys: keys, periods: 3}
	ctx := context.Background()

	// Holds: a 3s watchdog timeout renews every second.
	const timeout = 3 * time.Second
	res.period = timeout / 3
	cnt := &tripCounter{}
	rdb := newGoRedis(addr)
	rdb.AddHook(cnt)
	c := dlock.New(rdb, dlock.WithWatchdogTimeout(timeout))
	parallel(poolSize*4, poolSize, func(int) { rdb.Ping(ctx) }) // fill the pool before the baseline
	h0, _ := heap()
	ms := make([]*dlock.Mutex, holds)
	parallel(holds, poolSize, func(i int) {
		ms[i] = c.Mutex(fmt.Sprintf("scale:hold:%d", i))
		if err := ms[i].Lock(ctx); err != nil {
			res.err.add(err)
		}
	})
	h1, _ := heap()
	res.heapPerHold = (float64(h1) - float64(h0)) / float64(holds)
	// Count whole periods: start right after a renewal round (the watchdog
	// starts the next one a period after the last one ended) and stop just
	// after the periods-th round since.
	afterRound(cnt, 3*res.period)
	t0, n0 := cnt.trips.Load(), cnt.cmds.Load()
	time.Sleep(time.Duration(res.periods)*res.period + res.period/4)
	res.renewTrips, res.renewCalls = int(cnt.trips.Load()-t0), int(cnt.cmds.Load()-n0)
	parallel(holds, poolSize, func(i int) {
		if err := ms[i].Unlock(ctx); err != nil {
			res.err.add(err)
		}
	})
	_ = c.Close()
	_ = rdb.Close()

	// Waiters: one Client holds keys locks, another blocks waiters on them.
	hrdb, wrdb := newGoRedis(addr), newGoRedis(addr)
	hc, wc := dlock.New(hrdb), dlock.New(wrdb)
	defer func() { _ = hc.Close(); _ = wc.Close(); _ = hrdb.Close(); _ = wrdb.Close() }()
	holders := make([]*dlock.Mutex, keys)
	parallel(keys, poolSize, func(i int) {
		holders[i] = hc.Mutex(fmt.Sprintf("scale:wait:%d", i))
		if err := holders[i].Lock(ctx); err != nil {
			res.err.add(err)
		}
	})
	parallel(poolSize*4, poolSize, func(int) { wrdb.Ping(ctx) })
	h0, s0 := heap()
	var wg sync.WaitGroup
	var served atomic.Int64
	for i := range waiters {
		m := wc.Mutex(fmt.Sprintf("scale:wait:%d", i%keys))
		wg.Go(func() {
			if err := m.Lock(ctx); err != nil {
				res.err.add(err)
				return
			}
			served.Add(1)
			if err := m.Unlock(ctx); err != nil {
				res.err.add(err)
			}
		})
	}
	probe := newGoRedis(addr)
	defer probe.Close()
	deadline := time.Now().Add(time.Minute)
	for queuedIn(ctx, probe, keys) < waiters && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := queuedIn(ctx, probe, keys); n < waiters {
		res.err.add(fmt.Errorf("only %d of %d waiters queued after a minute", n, waiters))
	}
	h1, s1 := heap()
	res.heapPerWaiter = (float64(h1) - float64(h0)) / float64(waiters)
	res.stackPerWaiter = (float64(s1) - float64(s0)) / float64(waiters)
	if list, err := probe.Do(ctx, "client", "list", "type", "pubsub").Text(); err == nil {
		res.pubsubConns = len(strings.Split(strings.TrimSpace(list), "\n"))
	}
	start := time.Now()
	parallel(keys, poolSize, func(i int) {
		if err := holders[i].Unlock(ctx); err != nil {
			res.err.add(err)
		}
	})
	wg.Wait()
	res.served = time.Since(start)
	if int(served.Load()) != waiters {
		res.err.add(fmt.Errorf("%d of %d waiters served", served.Load(), waiters))
	}
	return res
}

// queuedIn counts the waiters queued in Redis on the scale:wait locks.
func queuedIn(ctx context.Context, rdb *redis.Client, keys int) int {
	cmds, _ := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range keys {
			p.ZCard(ctx, fmt.Sprintf("%s{scale:wait:%d}:mq", dlock.DefaultKeyPrefix, i))
		}
		return nil
	})
	n := 0
	for _, c := range cmds {
		n += int(c.(*redis.IntCmd).Val())
	}
	return n
}
