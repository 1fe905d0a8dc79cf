package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/redis/go-redis/v9"
)

// errBox keeps the first error a workload saw and counts them all.
type errBox struct {
	mu    sync.Mutex
	first error
	n     int
}

func (e *errBox) add(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.first == nil {
		e.first = err
	}
	e.n++
}

func (e *errBox) String() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.n == 0 {
		return ""
	}
	return fmt.Sprintf("%d errors, first: %v", e.n, e.first)
}

func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*p+0.999999) - 1
	return s[max(0, min(i, len(s)-1))]
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// runFor runs n goroutines calling body until d has passed and returns the
// summed operation count and the measured elapsed time. body returns how
// many operations it completed (0 on error).
func runFor(n int, d time.Duration, body func(g int, stop *atomic.Bool) int) (int, time.Duration) {
	var stop atomic.Bool
	var total atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g := range n {
		wg.Go(func() {
			<-start
			total.Add(int64(body(g, &stop)))
		})
	}
	t0 := time.Now()
	close(start)
	time.Sleep(d)
	stop.Store(true)
	el := time.Since(t0)
	wg.Wait()
	return int(total.Load()), el
}

// W1: uncontended Lock+Unlock pairs on distinct keys.
func w1Round(inst instance, prefix string, goroutines int, d time.Duration, eb *errBox) (rate float64, pairs int) {
	ctx := context.Background()
	n, el := runFor(goroutines, d, func(g int, stop *atomic.Bool) int {
		h := inst.Handle(fmt.Sprintf("%s:w1:%d", prefix, g))
		c := 0
		for !stop.Load() {
			if err := h.Lock(ctx); err != nil {
				eb.add(err)
				time.Sleep(time.Millisecond)
				continue
			}
			if err := h.Unlock(ctx); err != nil {
				eb.add(err)
				continue
			}
			c++
		}
		return c
	})
	return float64(n) / el.Seconds(), n
}

// W2: one holder, one blocked waiter on separate instances; the time from
// the holder's Unlock returning to the waiter's Lock returning (negative when
// the waiter learned first), and from the holder calling Unlock.
func w2Round(holder, waiter instance, key string, k int, eb *errBox) (out, fromCall []time.Duration) {
	fromCall, out = handoffRound(holder.Handle(key), waiter.Handle(key), k, eb, scriptClock{}, 0)
	return out, fromCall
}

// pingAfterIdle times PINGs sent after the idle pause W2's holder takes
// before Unlock: the physical floor of a call made from idle on this machine.
func pingAfterIdle(rdb *redis.Client, n int) []time.Duration { return pingAfterIdleFor(rdb, n, 0) }

// pingAfterIdleFor is pingAfterIdle after an idle pause of idle (0: 3-5ms).
func pingAfterIdleFor(rdb *redis.Client, n int, idle time.Duration) []time.Duration {
	ctx := context.Background()
	out := make([]time.Duration, 0, n)
	for range n {
		time.Sleep(holdFor(idle))
		t := time.Now()
		if rdb.Ping(ctx).Err() == nil {
			out = append(out, time.Since(t))
		}
	}
	return out
}

// publishAfterIdle times, after an idle pause of idle (0: 3-5ms), a script
// on pub that does nothing but publish, up to the message's arrival at a
// subscriber on sub: the least a handoff by pub/sub message can take from
// the release's call, whatever its script does (its server time adds to
// it). Nil if sub cannot subscribe.
func publishAfterIdle(pub, sub *redis.Client, n int, idle time.Duration) []time.Duration {
	ctx := context.Background()
	const channel = "floor:publish"
	ps := sub.Subscribe(ctx, channel)
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil {
		return nil
	}
	got := make(chan time.Time, 1)
	go func() {
		for {
			if _, err := ps.ReceiveMessage(ctx); err != nil {
				return
			}
			got <- time.Now()
		}
	}()
	script := redis.NewScript("return redis.call('PUBLISH', KEYS[1], ARGV[1])")
	out := make([]time.Duration, 0, n)
	for range n {
		time.Sleep(holdFor(idle))
		t := time.Now()
		if err := script.Run(ctx, pub, []string{channel}, "x").Err(); err != nil {
			continue
		}
		select {
		case at := <-got:
			out = append(out, at.Sub(t))
		case <-time.After(time.Second):
		}
	}
	return out
}

func pingRTTs(rdb *redis.Client, n int) []time.Duration {
	ctx := context.Background()
	out := make([]time.Duration, 0, n)
	for range n {
		t := time.Now()
		if rdb.Ping(ctx).Err() == nil {
			out = append(out, time.Since(t))
		}
	}
	return out
}

// W3: goroutines on one key, each holding it for hold.
type w3Result struct {
	rate       float64
	waits      []time.Duration
	holds      []time.Duration // the hold as slept: time.Sleep(hold) overshoots
	violations int64
}

func w3Round(inst instance, key string, goroutines int, hold, d time.Duration, eb *errBox) w3Result {
	ctx := context.Background()
	var inside, violations atomic.Int64
	var mu sync.Mutex
	var waits, holds []time.Duration
	n, el := runFor(goroutines, d, func(g int, stop *atomic.Bool) int {
		h := inst.Handle(key)
		var my, myHolds []time.Duration
		c := 0
		for !stop.Load() {
			t := time.Now()
			if err := h.Lock(ctx); err != nil {
				eb.add(err)
				time.Sleep(time.Millisecond)
				continue
			}
			if stop.Load() { // granted after the end: do not count it
				_ = h.Unlock(ctx)
				break
			}
			my = append(my, time.Since(t))
			if inside.Add(1) != 1 {
				violations.Add(1)
			}
			t = time.Now()
			time.Sleep(hold)
			myHolds = append(myHolds, time.Since(t))
			inside.Add(-1)
			if err := h.Unlock(ctx); err != nil {
				eb.add(err)
			}
			c++
		}
		mu.Lock()
		waits = append(waits, my...)
		holds = append(holds, myHolds...)
		mu.Unlock()
		return c
	})
	return w3Result{rate: float64(n) / el.Seconds(), waits: waits, holds: holds, violations: violations.Load()}
}

// W4a: dlock RWMutex, 90% reads / 10% writes, no hold time.
func w4RW(c *dlock.Client, name string, goroutines int, d time.Duration, eb *errBox) (float64, []time.Duration, []time.Duration) {
	ctx := context.Background()
	var mu sync.Mutex
	var rl, wl []time.Duration
	n, el := runFor(goroutines, d, func(g int, stop *atomic.Bool) int {
		rw := c.RWMutex(name, dlock.WithHandleOwner()) // one handle per goroutine: the handle is the owner
		var myR, myW []time.Duration
		c := 0
		for !stop.Load() {
			t := time.Now()
			if rand.N(10) == 0 {
				if err := rw.Lock(ctx); err != nil {
					eb.add(err)
					continue
				}
				if err := rw.Unlock(ctx); err != nil {
					eb.add(err)
				}
				myW = append(myW, time.Since(t))
			} else {
				if err := rw.RLock(ctx); err != nil {
					eb.add(err)
					continue
				}
				if err := rw.RUnlock(ctx); err != nil {
					eb.add(err)
				}
				myR = append(myR, time.Since(t))
			}
			c++
		}
		mu.Lock()
		rl, wl = append(rl, myR...), append(wl, myW...)
		mu.Unlock()
		return c
	})
	return float64(n) / el.Seconds(), rl, wl
}

// W4b: dlock Semaphore with permits permits, workers workers, each holding
// one permit for hold.
func w4Sem(c *dlock.Client, name string, permits, workers int, hold, d time.Duration, eb *errBox) (float64, []time.Duration) {
	ctx := context.Background()
	s := c.Semaphore(name)
	if _, err := s.TrySetPermits(ctx, permits); err != nil {
		eb.add(err)
		return 0, nil
	}
	var mu sync.Mutex
	var waits []time.Duration
	n, el := runFor(workers, d, func(g int, stop *atomic.Bool) int {
		var my []time.Duration
		c := 0
		for !stop.Load() {
			t := time.Now()
			p, err := s.Acquire(ctx, 1)
			if err != nil {
				eb.add(err)
				time.Sleep(time.Millisecond)
				continue
			}
			if stop.Load() {
				_ = p.Release(ctx)
				break
			}
			my = append(my, time.Since(t))
			time.Sleep(hold)
			if err := p.Release(ctx); err != nil {
				eb.add(err)
			}
			c++
		}
		mu.Lock()
		waits = append(waits, my...)
		mu.Unlock()
		return c
	})
	return float64(n) / el.Seconds(), waits
}

// holdFor is a handoff round's hold, or idle pause: d, or 3-5ms for 0.
func holdFor(d time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return 3*time.Millisecond + rand.N(2*time.Millisecond)
}
