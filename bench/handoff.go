package main

import (
	"context"
	"fmt"
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
	hold     time.Duration   // the holder's hold, and the floor's idle pause: 0 for 3-5ms
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
	// floorLong: PING after longHold idle, the floor of the rows after a
	// long hold.
	floorLong []time.Duration
	// publishLong: a script that only publishes, after longHold idle, to
	// the message's arrival on another client: the floor of a handoff by
	// message after a long hold, from the release's call.
	publishLong []time.Duration
	back        []time.Duration // PING back to back
	n           int
}

// handoffPair is one way of placing a holder and a waiter.
type handoffPair struct {
	name string
	h, w func(key string) handle
	hold time.Duration // 0: 3-5ms
}

// longHold is the hold of the handoff rows after a long hold: longer than
// a cohort's time bound (10ms), and long enough for connections to idle.
const longHold = 20 * time.Millisecond

// ownedHandle is a ReentrantMutex or an RWMutex's write side called with
// one owner.
type ownedHandle struct {
	m interface {
		Lock(ctx context.Context) error
		Unlock(ctx context.Context) error
	}
	ctx context.Context
}

func (o ownedHandle) Lock(context.Context) error   { return o.m.Lock(o.ctx) }
func (o ownedHandle) Unlock(context.Context) error { return o.m.Unlock(o.ctx) }

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
		{"Mutex, waiter on another Client", func(k string) handle { return cA.Mutex(k) }, func(k string) handle { return cB.Mutex(k) }, 0},
		{"Mutex, waiter on the same Client (another handle: local handoff)", func(k string) handle { return cA.Mutex(k) }, func(k string) handle { return cA.Mutex(k) }, 0},
		{"Mutex WithoutCohort, waiter on the same Client (through Redis, no message)",
			func(k string) handle { return cA.Mutex(k, dlock.WithoutCohort()) },
			func(k string) handle { return cA.Mutex(k, dlock.WithoutCohort()) }, 0},
		{"ReentrantMutex, waiter on another Client",
			func(k string) handle { return ownedHandle{cA.ReentrantMutex(k), dlock.WithNewOwner(bg)} },
			func(k string) handle { return ownedHandle{cB.ReentrantMutex(k), dlock.WithNewOwner(bg)} }, 0},
		{"ReentrantMutex, another owner on the same Client (local handoff)",
			func(k string) handle { return ownedHandle{cA.ReentrantMutex(k), dlock.WithNewOwner(bg)} },
			func(k string) handle { return ownedHandle{cA.ReentrantMutex(k), dlock.WithNewOwner(bg)} }, 0},
		{"RWMutex writer, waiter on another Client",
			func(k string) handle { return ownedHandle{cA.RWMutex(k), dlock.WithNewOwner(bg)} },
			func(k string) handle { return ownedHandle{cB.RWMutex(k), dlock.WithNewOwner(bg)} }, 0},
		{"Mutex, waiter on another Client, after a 20ms hold", func(k string) handle { return cA.Mutex(k) }, func(k string) handle { return cB.Mutex(k) }, longHold},
		{"Mutex, waiter on the same Client (another handle), after a 20ms hold", func(k string) handle { return cA.Mutex(k) }, func(k string) handle { return cA.Mutex(k) }, longHold},
		{"ReentrantMutex, another owner on the same Client, after a 20ms hold",
			func(k string) handle { return ownedHandle{cA.ReentrantMutex(k), dlock.WithNewOwner(bg)} },
			func(k string) handle { return ownedHandle{cA.ReentrantMutex(k), dlock.WithNewOwner(bg)} }, longHold},
		{"RWMutex writer, another owner on the same Client, after a 20ms hold",
			func(k string) handle { return ownedHandle{cA.RWMutex(k), dlock.WithNewOwner(bg)} },
			func(k string) handle { return ownedHandle{cA.RWMutex(k), dlock.WithNewOwner(bg)} }, longHold},
	}
	for _, l := range libraries() {
		if l.name != "rueidislock-1key" {
			continue
		}
		iA, errA := l.open(addr, nil)
		iB, errB := l.open(addr, nil)
		if errA == nil && errB == nil {
			defer iA.Close()
			defer iB.Close()
			pairs = append(pairs, handoffPair{l.name + ", waiter on another instance, after a 20ms hold", iA.Handle, iB.Handle, longHold})
		}
	}
	// The same handle's local handoff runs no script: keep it last (see
	// the script clock below).
	pairs = append(pairs, handoffPair{"Mutex, waiter on the same handle (local cohort handoff)",
		func(k string) handle { shared = cA.Mutex(k); return shared },
		func(k string) handle { return shared }, 0})
	res := &handoffResult{n: n}
	for _, p := range pairs {
		res.rows = append(res.rows, &handoffRow{name: p.name, hold: p.hold})
	}
	per := max(1, n/rounds)
	for i, p := range pairs { // warm up every pair's connections
		h := p.h(fmt.Sprintf("warm:handoff:%d", i))
		w := p.w(fmt.Sprintf("warm:handoff:%d", i))
		handoffRound(h, w, 3, &errBox{}, scriptClock{}, p.hold)
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
				res.floorLong = append(res.floorLong, pingAfterIdleFor(rdbA, per, longHold)...)
				res.publishLong = append(res.publishLong, publishAfterIdle(rdbA, rdbB, per, longHold)...)
				continue
			}
			p, row := pairs[i], res.rows[i]
			key := fmt.Sprintf("handoff:%d:%d", i, r)
			sc := scriptClock{}
			if i < len(pairs)-1 && !strings.HasPrefix(p.name, "rueidislock") { // the same handle's local handoff runs no script; rueidislock's are not dlock's
				sc = scriptClock{adm, func() bool {
					st, err := cA.Status(bg, key)
					return err == nil && st.Waiting > 0
				}, &row.script}
			}
			call, ret := handoffRound(p.h(key), p.w(key), per, &row.err, sc, p.hold)
			row.fromCall, row.fromRet = append(row.fromCall, call...), append(row.fromRet, ret...)
		}
	}
	res.back = pingRTTs(rdbA, 200)
	return res
}

// handoffRound is W2's round: the holder takes the lock, a waiter blocks on
// it, the holder sleeps hold (0: 3-5ms) and unlocks.
func handoffRound(h, w handle, k int, eb *errBox, sc scriptClock, hold time.Duration) (fromCall, fromRet []time.Duration) {
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
		time.Sleep(holdFor(hold))
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
	p("One holder, one blocked waiter; the holder sleeps 3-5ms (or %v where the row says so), then unlocks. Latency is from the holder's Unlock call to the waiter's Lock returning. ", longHold)
	p("The floor is a PING sent after the same idle pause, on the holder's client, interleaved with the handoffs round by round (a PING back to back takes %s).\n\n", fmtDur(pct(res.back, .5)))
	p("The server column is redis-server's own time in the Unlock's script (INFO commandstats, p50), which no client work can shorten; a PING's is about 1 µs. ")
	p("A local handoff runs no script: a waiter's place in the queue in Redis, if it has one, stays there until the cohort's release drops it. ")
	p("The last row is the least a handoff by message to another Client can take after a long hold: a script that does nothing but publish, timed to the message's arrival; a handoff's script does more, and after an idle pause each call inside a script costs several times what it does back to back.\n\n")
	p("| handoff | p50 | p99 | p50 / floor p50 | from Unlock returning, p50 | server, p50 | n | errors |\n|---|--:|--:|--:|--:|--:|--:|---|\n")
	floorLong := pct(res.floorLong, .5)
	for _, r := range res.rows {
		f := floor
		if r.hold > 0 {
			f = floorLong
		}
		p("| %s | %s | %s | %.2f | %s | %s | %d | %s |\n", r.name, fmtDur(pct(r.fromCall, .5)), fmtDur(pct(r.fromCall, .99)),
			float64(pct(r.fromCall, .5))/float64(max(1, f)), fmtDur(pct(r.fromRet, .5)), scriptCell(r.script), len(r.fromCall), errCell(&r.err, nil))
	}
	p("| floor: PING after idle | %s | %s | 1.00 | | | %d | |\n", fmtDur(floor), fmtDur(pct(res.floor, .99)), len(res.floor))
	p("| floor: PING after %v idle (for the rows after a %v hold) | %s | %s | 1.00 | | | %d | |\n", longHold, longHold, fmtDur(floorLong), fmtDur(pct(res.floorLong, .99)), len(res.floorLong))
	p("| floor of a handoff by message: a script that only publishes, after %v idle, to the message's arrival on another client | %s | %s | %.2f | | | %d | |\n",
		longHold, fmtDur(pct(res.publishLong, .5)), fmtDur(pct(res.publishLong, .99)), float64(pct(res.publishLong, .5))/float64(max(1, floorLong)), len(res.publishLong))
	return b.String()
}

func scriptCell(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	return fmtDur(pct(ds, .5))
}
