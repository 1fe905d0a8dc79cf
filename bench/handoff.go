package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/redis/go-redis/v9"
)

// The handoff section (-only handoff): dlock Mutex handoff latency to a
// waiter on the same Client and on another Client, against the floor of the
// same run, a PING sent after the same idle pause, all interleaved round by
// round so that the machine's noise falls on every row alike. Also a local
// handoff between two goroutines sharing one handle (lock cohorting).

type handoffRow struct {
	name     string
	fromCall []time.Duration // from the holder's Unlock call to the waiter's Lock returning
	fromRet  []time.Duration // from the holder's Unlock returning
	script   []time.Duration // redis-server's time in the Unlock's script (SLOWLOG)
	err      errBox
}

// scriptClock measures redis-server's own time in the holder's Unlock
// script, from INFO commandstats (which Redis keeps anyway, so measuring
// costs the server nothing per command): once the waiter is queued, the
// counters are reset, then the holder idles and unlocks, and after the
// handoff the time of the EVALSHA calls since the reset is read. A waiter
// handed the lock takes the message as its grant and runs no script, so
// that is the Unlock's alone (a watchdog renewal, every 10 s, may fall in).
// The reads are outside the timed span; the reset is before the idle pause.
type scriptClock struct {
	rdb    *redis.Client
	queued func() bool // whether the waiter is queued in Redis
	d      *[]time.Duration
}

func (s scriptClock) reset() {
	if s.rdb == nil {
		return
	}
	for end := time.Now().Add(time.Second); !s.queued() && time.Now().Before(end); {
		time.Sleep(100 * time.Microsecond)
	}
	s.rdb.ConfigResetStat(context.Background())
}

func (s scriptClock) read() {
	if s.rdb == nil {
		return
	}
	info, err := s.rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		return
	}
	for line := range strings.Lines(info) {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:")
		if !ok {
			continue
		}
		for field := range strings.SplitSeq(rest, ",") {
			if v, ok := strings.CutPrefix(field, "usec="); ok {
				if us, err := strconv.Atoi(v); err == nil {
					*s.d = append(*s.d, time.Duration(us)*time.Microsecond)
				}
			}
		}
	}
}

type handoffResult struct {
	rows  []*handoffRow
	floor []time.Duration // PING after idle, on the holder's client
	back  []time.Duration // PING back to back
	n     int
}

// handoffPair is one way of placing a holder and a waiter.
type handoffPair struct {
	name string
	h, w func(key string) handle
}

func runHandoff(addr string, n, rounds int) *handoffResult {
	rdbA, rdbB, adm := newGoRedis(addr), newGoRedis(addr), newGoRedis(addr)
	defer rdbA.Close()
	defer rdbB.Close()
	defer adm.Close()
	bg := context.Background()
	cA, cB := dlock.New(rdbA), dlock.New(rdbB)
	defer cA.Close()
	defer cB.Close()
	var shared *dlock.Mutex
	pairs := []handoffPair{
		{"Mutex, waiter on another Client", func(k string) handle { return cA.Mutex(k) }, func(k string) handle { return cB.Mutex(k) }},
		{"Mutex, waiter on the same Client (another handle: local handoff)", func(k string) handle { return cA.Mutex(k) }, func(k string) handle { return cA.Mutex(k) }},
		{"Mutex WithoutCohort, waiter on the same Client (through Redis, no message)",
			func(k string) handle { return cA.Mutex(k, dlock.WithoutCohort()) },
			func(k string) handle { return cA.Mutex(k, dlock.WithoutCohort()) }},
		{"Mutex, waiter on the same handle (local cohort handoff)",
			func(k string) handle { shared = cA.Mutex(k); return shared },
			func(k string) handle { return shared }},
	}
	res := &handoffResult{n: n}
	for _, p := range pairs {
		res.rows = append(res.rows, &handoffRow{name: p.name})
	}
	per := max(1, n/rounds)
	for i, p := range pairs { // warm up every pair's connections
		h := p.h(fmt.Sprintf("warm:handoff:%d", i))
		w := p.w(fmt.Sprintf("warm:handoff:%d", i))
		handoffRound(h, w, 3, &errBox{}, scriptClock{})
	}
	pingAfterIdle(rdbA, 5)
	for r := range rounds {
		order := make([]int, len(pairs)+1) // the last: the floor
		for i := range order {
			order[i] = i
		}
		for _, i := range rotate(order, r) {
			if i == len(pairs) {
				res.floor = append(res.floor, pingAfterIdle(rdbA, per)...)
				continue
			}
			p, row := pairs[i], res.rows[i]
			key := fmt.Sprintf("handoff:%d:%d", i, r)
			sc := scriptClock{}
			if i < len(pairs)-1 { // the same handle's local handoff runs no script
				sc = scriptClock{adm, func() bool {
					st, err := cA.Status(bg, key)
					return err == nil && st.Waiting > 0
				}, &row.script}
			}
			call, ret := handoffRound(p.h(key), p.w(key), per, &row.err, sc)
			row.fromCall, row.fromRet = append(row.fromCall, call...), append(row.fromRet, ret...)
		}
	}
	res.back = pingRTTs(rdbA, 200)
	return res
}

// handoffRound is W2's round: the holder takes the lock, a waiter blocks on
// it, the holder sleeps 3-5ms and unlocks.
func handoffRound(h, w handle, k int, eb *errBox, sc scriptClock) (fromCall, fromRet []time.Duration) {
	ctx := context.Background()
	for range k {
		if err := h.Lock(ctx); err != nil {
			eb.add(fmt.Errorf("holder lock: %w", err))
			return
		}
		got := make(chan error, 1)
		var t1 time.Time
		go func() {
			err := w.Lock(ctx)
			t1 = time.Now()
			got <- err
		}()
		sc.reset()
		time.Sleep(3*time.Millisecond + rand.N(2*time.Millisecond))
		tc := time.Now()
		if err := h.Unlock(ctx); err != nil {
			eb.add(fmt.Errorf("holder unlock: %w", err))
		}
		t0 := time.Now()
		select {
		case err := <-got:
			if err != nil {
				eb.add(fmt.Errorf("waiter lock: %w", err))
				return
			}
		case <-time.After(10 * time.Second):
			eb.add(fmt.Errorf("waiter not granted within 10s"))
			return
		}
		sc.read()
		fromCall = append(fromCall, t1.Sub(tc))
		fromRet = append(fromRet, t1.Sub(t0))
		if err := w.Unlock(ctx); err != nil {
			eb.add(fmt.Errorf("waiter unlock: %w", err))
		}
	}
	return
}

func handoffTable(res *handoffResult) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	floor := pct(res.floor, .5)
	p("### Handoff latency against the PING-after-idle floor of the same run, %d handoffs per row\n\n", res.n)
	p("One holder, one blocked waiter; the holder sleeps 3-5ms, then unlocks. Latency is from the holder's Unlock call to the waiter's Lock returning. ")
	p("The floor is a PING sent after the same idle pause, on the holder's client, interleaved with the handoffs round by round (a PING back to back takes %s).\n\n", fmtDur(pct(res.back, .5)))
	p("The server column is redis-server's own time in the Unlock's script (INFO commandstats, p50), which no client work can shorten; a PING's is about 1 µs. ")
	p("A local handoff to a waiter on the same handle runs no script; to a waiter on another handle, the Unlock's script takes the waiter's place out of the queue in Redis after the waiter holds (so it is not on the handoff's path).\n\n")
	p("| handoff | p50 | p99 | p50 / floor p50 | from Unlock returning, p50 | server, p50 | n | errors |\n|---|--:|--:|--:|--:|--:|--:|---|\n")
	for _, r := range res.rows {
		p("| %s | %s | %s | %.2f | %s | %s | %d | %s |\n", r.name, fmtDur(pct(r.fromCall, .5)), fmtDur(pct(r.fromCall, .99)),
			float64(pct(r.fromCall, .5))/float64(max(1, floor)), fmtDur(pct(r.fromRet, .5)), scriptCell(r.script), len(r.fromCall), errCell(&r.err, nil))
	}
	p("| floor: PING after idle | %s | %s | 1.00 | | | %d | |\n", fmtDur(floor), fmtDur(pct(res.floor, .99)), len(res.floor))
	return b.String()
}

func scriptCell(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	return fmtDur(pct(ds, .5))
}
