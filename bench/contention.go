package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/dlock-go/dlock"
)

// The contention section: C Clients (each on its own Redis client and
// connection pool, standing for C processes), each with G goroutines, all on
// one lock name. Each goroutine loops Lock, hold, Unlock. It measures the
// handoff rate against the bound the hold sets, the round trips to Redis per
// handoff, the waits, how evenly the goroutines were served, and checks
// mutual exclusion.

type contConfig struct {
	clients    []int
	goroutines int
	warmup     time.Duration
	dur        time.Duration
	hold       time.Duration
}

// contEntry is one lock of the section: a dlock primitive or a peer
// library's mutex.
type contEntry struct {
	prim      string // the primitive, e.g. "Mutex"
	lib       string // the library
	settings  string
	open      func(addr string, cnt *rtCounter) (contClient, error)
	elsewhere bool // its Redis servers are not the spy's (Redlock masters): no pub/sub counts
	permits   int  // a semaphore's permits: that many may hold at once, and its bound is permits / hold; 0: a lock
}

// semPermits is the Semaphore row's number of permits.
const semPermits = 2

// semCont is one Client of the Semaphore row: each goroutine acquires and
// releases one permit of a semaphore of semPermits.
type semCont struct {
	rdb *redis.Client
	c   *dlock.Client
	s   *dlock.Semaphore
}

type semWorker struct {
	s *dlock.Semaphore
	p *dlock.Permit
}

func (w *semWorker) Lock(ctx context.Context) (err error) {
	w.p, err = w.s.Acquire(ctx, 1)
	return err
}

func (w *semWorker) Unlock(ctx context.Context) error { return w.p.Release(ctx) }

func (s *semCont) worker(key string) (context.Context, handle) {
	if s.s == nil {
		s.s = s.c.Semaphore(key)
		_ = s.s.SetPermits(context.Background(), semPermits)
	}
	return context.Background(), &semWorker{s: s.s}
}

func (s *semCont) Close() { _ = s.c.Close(); _ = s.rdb.Close() }

// contClient is one "process": one Client of the entry on its own Redis
// client.
type contClient interface {
	// worker returns one goroutine's lock on key and the context to call it
	// with. It is called before the goroutines start, one goroutine at a time.
	worker(key string) (context.Context, handle)
	Close()
}

// cohortBounds are the WithCohort bounds the section runs a row for
// besides the default Mutex's (-cont-cohort).
var cohortBounds []int

// contOnlyLibs, when set, are the only libraries whose rows the section runs
// (-cont-libs).
var contOnlyLibs []string

// contOnlyPrims, when set, are the only primitives (the rows' first
// column: "Mutex", "ReentrantMutex", ...) whose rows the section runs
// (-cont-prims).
var contOnlyPrims []string

// contEntries are the section's entries; masters, when given, are the
// Redlock masters for the Redlock Mutex rows (dlock against redsync).
func contEntries(masters []string) []contEntry {
	es := []contEntry{
		{
			prim: "Mutex", lib: "dlock",
			settings: fmt.Sprintf("one c.Mutex(name) handle per Client, shared by its goroutines (a Mutex handle may be shared, like sync.Mutex); defaults, so lock cohorting: up to %d local handoffs per Redis grant, within %v", dlock.DefaultCohortHandoffs, dlock.DefaultCohortTime),
			open: func(addr string, cnt *rtCounter) (contClient, error) {
				return newDlockCont(addr, cnt, func(c *dlock.Client, key string) handle { return c.Mutex(key) }, false), nil
			},
		},
		{
			prim: "ReentrantMutex", lib: "dlock",
			settings: "one c.ReentrantMutex(name) handle per Client, shared by its goroutines; each goroutine calls it with its own owner (dlock.WithNewOwner once per goroutine); defaults, so lock cohorting between the owners of a Client, as the Mutex's",
			open: func(addr string, cnt *rtCounter) (contClient, error) {
				return newDlockCont(addr, cnt, func(c *dlock.Client, key string) handle { return c.ReentrantMutex(key) }, true), nil
			},
		},
		{
			prim: "RWMutex (write)", lib: "dlock",
			settings: "one c.RWMutex(name) handle per Client, shared by its goroutines, Lock/Unlock (the write side) only; each goroutine with its own owner (dlock.WithNewOwner); defaults, so lock cohorting between the writers of a Client, as the Mutex's",
			open: func(addr string, cnt *rtCounter) (contClient, error) {
				return newDlockCont(addr, cnt, func(c *dlock.Client, key string) handle { return c.RWMutex(key) }, true), nil
			},
		},
		{
			prim: fmt.Sprintf("Semaphore (%d permits)", semPermits), lib: "dlock", permits: semPermits,
			settings: fmt.Sprintf("one c.Semaphore(name) handle per Client with SetPermits(%d); each goroutine Acquire(ctx, 1) and Permit.Release; its bound is %d / hold, and a violation is more than %d holders at once", semPermits, semPermits, semPermits),
			open: func(addr string, cnt *rtCounter) (contClient, error) {
				rdb := newCounted(addr, cnt)
				return &semCont{rdb: rdb, c: dlock.New(rdb)}, nil
			},
		},
	}
	// After the default Mutex: one WithoutCohort, and one WithCohort row per
	// bound asked for.
	cohorts := []contEntry{{
		prim: "Mutex, a handle per goroutine", lib: "dlock",
		settings: "as Mutex, but each goroutine makes its own c.Mutex(name) handle, as W3 does: the Client's cohort serves waiters on every handle of the name",
		open: func(addr string, cnt *rtCounter) (contClient, error) {
			d := newDlockCont(addr, cnt, func(c *dlock.Client, key string) handle { return c.Mutex(key) }, false)
			d.perGoroutine = true
			return d, nil
		},
	}, {
		prim: "Mutex WithoutCohort", lib: "dlock",
		settings: "as Mutex, with dlock.WithoutCohort(): every Lock through the queue in Redis, in strict arrival order",
		open: func(addr string, cnt *rtCounter) (contClient, error) {
			return newDlockCont(addr, cnt, func(c *dlock.Client, key string) handle { return c.Mutex(key, dlock.WithoutCohort()) }, false), nil
		},
	}}
	for _, k := range cohortBounds {
		set := fmt.Sprintf("as Mutex, with dlock.WithCohort(%d, 0): up to %d local handoffs per Redis grant, within %v", k, k, dlock.DefaultCohortTime)
		cohorts = append(cohorts, contEntry{
			prim: fmt.Sprintf("Mutex WithCohort(%d)", k), lib: "dlock", settings: set,
			open: func(addr string, cnt *rtCounter) (contClient, error) {
				return newDlockCont(addr, cnt, func(c *dlock.Client, key string) handle { return c.Mutex(key, dlock.WithCohort(k, 0)) }, false), nil
			},
		})
	}
	es = slices.Insert(es, 1, cohorts...)
	if len(masters) > 0 {
		for _, l := range redlockLibs(masters) {
			es = append(es, contEntry{
				prim: fmt.Sprintf("Redlock Mutex (%d masters)", len(masters)), lib: strings.Fields(l.name)[0], elsewhere: true,
				settings: "as in the Redlock section (" + l.settings + "); one instance per Client, one lock object per goroutine; round trips are summed over the masters",
				open: func(addr string, cnt *rtCounter) (contClient, error) {
					inst, err := l.open(addr, cnt)
					if err != nil {
						return nil, err
					}
					return libCont{inst}, nil
				},
			})
		}
	}
	for _, l := range libraries() {
		if l.name == "dlock" {
			continue
		}
		es = append(es, contEntry{
			prim: "Mutex", lib: l.name,
			settings: "as in W1-W3 (" + l.settings + "); one instance per Client, one lock object per goroutine (its lock objects hold one acquisition each)",
			open: func(addr string, cnt *rtCounter) (contClient, error) {
				inst, err := l.open(addr, cnt)
				if err != nil {
					return nil, err
				}
				return libCont{inst}, nil
			},
		})
	}
	return es
}

type dlockCont struct {
	rdb      *redis.Client
	c        *dlock.Client
	mk       func(c *dlock.Client, key string) handle
	h        handle
	newOwner bool
	// perGoroutine: each worker gets a handle of its own, not the shared h
	perGoroutine bool
}

func newDlockCont(addr string, cnt *rtCounter, mk func(*dlock.Client, string) handle, newOwner bool) *dlockCont {
	rdb := newCounted(addr, cnt)
	return &dlockCont{rdb: rdb, c: dlock.New(rdb), mk: mk, newOwner: newOwner}
}

func (d *dlockCont) worker(key string) (context.Context, handle) {
	if d.perGoroutine {
		return context.Background(), d.mk(d.c, key)
	}
	if d.h == nil {
		d.h = d.mk(d.c, key)
	}
	ctx := context.Background()
	if d.newOwner {
		ctx = dlock.WithNewOwner(ctx)
	}
	return ctx, d.h
}

func (d *dlockCont) Close() { _ = d.c.Close(); _ = d.rdb.Close() }

type libCont struct{ inst instance }

func (l libCont) worker(key string) (context.Context, handle) {
	return context.Background(), l.inst.Handle(key)
}
func (l libCont) Close() { l.inst.Close() }

// rtCounter counts round trips to Redis: a go-redis hook (a command or a
// pipeline is one round trip) and a rueidis.Client wrapper (a Do or a DoMulti
// is one). Connection set-up commands (HELLO, CLIENT ..., AUTH, SELECT) are
// counted apart. It also counts client-side-caching invalidation messages a
// rueidis client receives (rueidislock's wake-up).
type rtCounter struct {
	trips, cmds, setup, invalidations atomic.Int64
}

func setupCmd(name string) bool {
	switch name {
	case "hello", "client", "auth", "select":
		return true
	}
	return false
}

func (c *rtCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *rtCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if setupCmd(cmd.Name()) {
			c.setup.Add(1)
		} else {
			c.trips.Add(1)
			c.cmds.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (c *rtCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		n := 0
		for _, cmd := range cmds {
			if !setupCmd(cmd.Name()) {
				n++
			}
		}
		if n == 0 {
			c.setup.Add(1)
		} else {
			c.trips.Add(1)
			c.cmds.Add(int64(n))
		}
		return next(ctx, cmds)
	}
}

// rueidisBuilder is a rueidislock ClientBuilder that counts.
func (c *rtCounter) rueidisBuilder(opt rueidis.ClientOption) (rueidis.Client, error) {
	if on := opt.OnInvalidations; on != nil {
		opt.OnInvalidations = func(ms []rueidis.RedisMessage) {
			c.invalidations.Add(int64(max(1, len(ms)))) // nil: all keys (a reconnect)
			on(ms)
		}
	}
	cl, err := rueidis.NewClient(opt)
	if err != nil {
		return nil, err
	}
	return countedRueidis{Client: cl, cnt: c}, nil
}

// countedRueidis counts the calls rueidislock makes (it uses Do only; the
// others are counted for completeness). rueidis pipelines concurrent calls on
// one connection by itself, so for it the count is of calls, an upper bound
// on the network round trips.
type countedRueidis struct {
	rueidis.Client
	cnt *rtCounter
}

func (c countedRueidis) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	c.cnt.trips.Add(1)
	c.cnt.cmds.Add(1)
	return c.Client.Do(ctx, cmd)
}

func (c countedRueidis) DoMulti(ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
	c.cnt.trips.Add(1)
	c.cnt.cmds.Add(int64(len(multi)))
	return c.Client.DoMulti(ctx, multi...)
}

func (c countedRueidis) DoCache(ctx context.Context, cmd rueidis.Cacheable, ttl time.Duration) rueidis.RedisResult {
	c.cnt.trips.Add(1) // a cache hit sends nothing; rueidislock does not use it
	c.cnt.cmds.Add(1)
	return c.Client.DoCache(ctx, cmd, ttl)
}

func (c countedRueidis) DoMultiCache(ctx context.Context, multi ...rueidis.CacheableTTL) []rueidis.RedisResult {
	c.cnt.trips.Add(1)
	c.cnt.cmds.Add(int64(len(multi)))
	return c.Client.DoMultiCache(ctx, multi...)
}

// pubsubSpy counts the messages published on every channel (PSUBSCRIBE *),
// on a client of its own that nothing else counts.
type pubsubSpy struct {
	rdb *redis.Client
	ps  *redis.PubSub
	mu  sync.Mutex
	n   map[string]int64
	wg  sync.WaitGroup
}

func newSpy(addr string) (*pubsubSpy, error) {
	ctx := context.Background()
	s := &pubsubSpy{rdb: newGoRedis(addr), n: map[string]int64{}}
	s.ps = s.rdb.PSubscribe(ctx, "*")
	if _, err := s.ps.Receive(ctx); err != nil { // the confirmation
		_ = s.ps.Close()
		_ = s.rdb.Close()
		return nil, err
	}
	s.wg.Go(func() {
		for {
			m, err := s.ps.ReceiveMessage(ctx)
			if err != nil {
				return // closed
			}
			s.mu.Lock()
			s.n[m.Channel]++
			s.mu.Unlock()
		}
	})
	return s, nil
}

func (s *pubsubSpy) snapshot() map[string]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.n)
}

// numsub returns the subscriber count of every channel in chans (the spy's
// pattern subscription is not among them).
func (s *pubsubSpy) numsub(chans []string) map[string]int64 {
	if len(chans) == 0 {
		return nil
	}
	m, _ := s.rdb.PubSubNumSub(context.Background(), chans...).Result()
	return m
}

func (s *pubsubSpy) Close() { _ = s.ps.Close(); s.wg.Wait(); _ = s.rdb.Close() }

// contRun is one (entry, C) measurement.
type contRun struct {
	entry       contEntry
	clients     int
	goroutines  int
	acq         int           // acquisitions in the measured window
	el          time.Duration // the measured window
	holdMean    time.Duration // mean hold as slept in the window
	trips, cmds int64
	setup       int64
	published   int64 // pub/sub messages published in the window
	delivered   int64 // published x subscribers at mid-window, per channel
	invalid     int64 // CSC invalidation messages received (rueidis)
	waits       []time.Duration
	perG        []int
	violations  int64
	stuck       int // goroutines still in Lock 30s after the end
	openErr     error
	err         errBox
}

func (r *contRun) rate() float64 {
	if r.el <= 0 {
		return 0
	}
	return float64(r.acq) / r.el.Seconds()
}

type contResult struct {
	cfg        contConfig
	sleepMean  time.Duration // time.Sleep(hold) on the idle machine
	sleepP50   time.Duration
	sleepP99   time.Duration
	runs       []*contRun
	spyErr     error
	elapsed    time.Duration
	entryNames []contEntry
}

// calibrateSleep times n calls of time.Sleep(d).
func calibrateSleep(d time.Duration, n int) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		t := time.Now()
		time.Sleep(d)
		out[i] = time.Since(t)
	}
	return out
}

func meanDur(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	var s time.Duration
	for _, d := range ds {
		s += d
	}
	return s / time.Duration(len(ds))
}

func runContention(cc contConfig, addr string) *contResult {
	t0 := time.Now()
	masters, stopMasters, err := startMasters(3)
	if err != nil {
		fmt.Printf("Contention: no Redlock rows, the masters did not start: %v\n", err)
	} else {
		defer stopMasters()
	}
	res := &contResult{cfg: cc, entryNames: contEntries(masters)}
	if len(contOnlyLibs) > 0 {
		res.entryNames = slices.DeleteFunc(res.entryNames, func(e contEntry) bool { return !slices.Contains(contOnlyLibs, e.lib) })
	}
	if len(contOnlyPrims) > 0 {
		res.entryNames = slices.DeleteFunc(res.entryNames, func(e contEntry) bool { return !slices.Contains(contOnlyPrims, e.prim) })
	}
	cal := calibrateSleep(cc.hold, 500)
	res.sleepMean, res.sleepP50, res.sleepP99 = meanDur(cal), pct(cal, .5), pct(cal, .99)
	spy, err := newSpy(addr)
	if err != nil {
		res.spyErr = err
	} else {
		defer spy.Close()
	}
	fmt.Printf("Contention: C Clients x %d goroutines on one lock name, hold %v, %v warm-up + %v per run; time.Sleep(%v) takes %v on average here\n",
		cc.goroutines, cc.hold, cc.warmup, cc.dur, cc.hold, fmtDur(res.sleepMean))
	for _, c := range cc.clients {
		for _, e := range res.entryNames {
			key := fmt.Sprintf("cont:%s:%s:%d", e.lib, strings.ReplaceAll(e.prim, " ", ""), c)
			r := contRound(e, addr, key, c, cc, spy)
			res.runs = append(res.runs, r)
			if r.openErr != nil {
				fmt.Printf("  C=%-2d %-6s %-16s open failed: %v\n", c, e.lib, e.prim, r.openErr)
				continue
			}
			fmt.Printf("  C=%-2d %-11s %-22s %6.0f handoffs/s  %5.2f round trips/handoff  wait p99 %-9s  acq/goroutine %d..%d  violations %d %s\n",
				c, e.lib, e.prim, r.rate(), float64(r.trips)/float64(max(1, r.acq)), fmtDur(pct(r.waits, .99)),
				slices.Min(r.perG), slices.Max(r.perG), r.violations, r.err.String())
		}
	}
	res.elapsed = time.Since(t0)
	return res
}

func contRound(e contEntry, addr, key string, c int, cc contConfig, spy *pubsubSpy) *contRun {
	r := &contRun{entry: e, clients: c, goroutines: cc.goroutines}
	cnt := &rtCounter{}
	var cls []contClient
	closeAll := func() {
		for _, cl := range cls {
			cl.Close()
		}
	}
	for range c {
		cl, err := e.open(addr, cnt)
		if err != nil {
			r.openErr = err
			closeAll()
			return r
		}
		cls = append(cls, cl)
	}
	type worker struct {
		ctx context.Context
		h   handle
	}
	var ws []worker
	for _, cl := range cls {
		for range cc.goroutines {
			ctx, h := cl.worker(key)
			ws = append(ws, worker{ctx, h})
		}
	}

	const (
		warming = iota
		measuring
		stopped
	)
	var phase atomic.Int32
	var inside, violations, inLock atomic.Int64
	counts := make([]int, len(ws))
	waits := make([][]time.Duration, len(ws))
	holdSum := make([]time.Duration, len(ws))
	var wg sync.WaitGroup
	for g, w := range ws {
		wg.Go(func() {
			for phase.Load() != stopped {
				t := time.Now()
				inLock.Add(1)
				err := w.h.Lock(w.ctx)
				inLock.Add(-1)
				if err != nil {
					r.err.add(fmt.Errorf("lock: %w", err))
					time.Sleep(time.Millisecond)
					continue
				}
				got := time.Now()
				ph := phase.Load()
				if inside.Add(1) > int64(max(1, e.permits)) {
					violations.Add(1)
				}
				t1 := time.Now()
				time.Sleep(cc.hold)
				held := time.Since(t1)
				inside.Add(-1)
				if err := w.h.Unlock(w.ctx); err != nil {
					r.err.add(fmt.Errorf("unlock: %w", err))
				}
				if ph == measuring {
					counts[g]++
					waits[g] = append(waits[g], got.Sub(t))
					holdSum[g] += held
				}
			}
		})
	}

	time.Sleep(cc.warmup)
	var pub0 map[string]int64
	if spy != nil {
		pub0 = spy.snapshot()
	}
	trips0, cmds0, setup0, inv0 := cnt.trips.Load(), cnt.cmds.Load(), cnt.setup.Load(), cnt.invalidations.Load()
	phase.Store(measuring)
	start := time.Now()
	time.Sleep(cc.dur / 2)
	var subs map[string]int64
	if spy != nil {
		subs = spy.numsub(slices.Collect(maps.Keys(spy.snapshot())))
	}
	time.Sleep(cc.dur - cc.dur/2)
	phase.Store(stopped)
	r.el = time.Since(start)
	r.trips, r.cmds = cnt.trips.Load()-trips0, cnt.cmds.Load()-cmds0
	r.setup, r.invalid = cnt.setup.Load()-setup0, cnt.invalidations.Load()-inv0
	if spy != nil {
		for ch, n := range spy.snapshot() {
			d := n - pub0[ch]
			r.published += d
			r.delivered += d * subs[ch]
		}
	}

	// Every waiter is served in turn once the loops stop; a goroutine still
	// in Lock long after that is stuck. Closing the Clients ends its Lock.
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		closeAll()
	case <-time.After(30 * time.Second):
		r.stuck = int(inLock.Load())
		closeAll()
		select {
		case <-done:
			r.err.add(fmt.Errorf("%d goroutines still in Lock 30s after the end; closing the Clients ended them", r.stuck))
		case <-time.After(10 * time.Second):
			r.err.add(fmt.Errorf("%d goroutines still in Lock 30s after the end, and 10s after closing the Clients", r.stuck))
		}
	}
	r.violations = violations.Load()

	var holds time.Duration
	for g := range ws {
		r.acq += counts[g]
		r.waits = append(r.waits, waits[g]...)
		holds += holdSum[g]
	}
	r.perG = counts
	if r.acq > 0 {
		r.holdMean = holds / time.Duration(r.acq)
	}
	return r
}

// contTable renders the section as Markdown.
func contTable(res *contResult) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	cc := res.cfg
	p("### Contention across Clients: C Clients x %d goroutines on one lock name, hold time.Sleep(%v), %v per run after %v warm-up\n\n",
		cc.goroutines, cc.hold, cc.dur, cc.warmup)
	p("Each Client stands for a process: its own go-redis client and connection pool (rueidislock: its own rueidis client). Each goroutine loops Lock, hold, Unlock. ")
	p("The hold bound is 1 / (mean hold as slept in the run): holds are serial, so handoffs/s can reach it only if handoffs cost nothing; the ratio is the fraction of the time the lock was held. ")
	p("time.Sleep(%v) takes %s on average on the idle machine (p50 %s, p99 %s), a bound of %.0f/s.\n\n",
		cc.hold, fmtDur(res.sleepMean), fmtDur(res.sleepP50), fmtDur(res.sleepP99), float64(time.Second)/float64(max(1, res.sleepMean)))
	p("| primitive | library | C x G | handoffs/s | hold bound | ratio | round trips / handoff | commands / handoff | pub/sub published / delivered per handoff | wait p50 | wait p99 | wait max | acquisitions per goroutine min / max | exclusion violations | errors |\n")
	p("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n")
	for _, r := range res.runs {
		e := r.entry
		if r.openErr != nil {
			p("| %s | %s | %d x %d | | | | | | | | | | | | open failed: %s |\n", e.prim, e.lib, r.clients, r.goroutines, strings.ReplaceAll(r.openErr.Error(), "|", "/"))
			continue
		}
		acq := float64(max(1, r.acq))
		bound, ratio := "-", "-"
		if r.holdMean > 0 {
			k := float64(max(1, e.permits))
			bound = fmt.Sprintf("%.0f", k*float64(time.Second)/float64(r.holdMean))
			ratio = fmt.Sprintf("%.2f", r.rate()*r.holdMean.Seconds()/k)
		}
		msgs := fmt.Sprintf("%.2f / %.2f", float64(r.published)/acq, float64(r.delivered)/acq)
		if e.elsewhere {
			msgs = "not counted"
		}
		if r.invalid > 0 || e.lib == "rueidislock" {
			msgs += fmt.Sprintf(" (+ %.2f CSC invalidations)", float64(r.invalid)/acq)
		}
		fair := fmt.Sprintf("%d / %d", slices.Min(r.perG), slices.Max(r.perG))
		if z := zeros(r.perG); z > 0 {
			fair += fmt.Sprintf(" (**%d starved**)", z)
		}
		p("| %s | %s | %d x %d | %.0f | %s | %s | %.2f | %.2f | %s | %s | %s | %s | %s | %d | %s |\n",
			e.prim, e.lib, r.clients, r.goroutines, r.rate(), bound, ratio,
			float64(r.trips)/acq, float64(r.cmds)/acq, msgs,
			fmtDur(pct(r.waits, .5)), fmtDur(pct(r.waits, .99)), fmtDur(pct(r.waits, 1)),
			fair, r.violations, errCell(&r.err, nil))
	}
	p("\nRound trips are counted by a go-redis hook on every Client's client (a command or a pipeline is one; HELLO, CLIENT, AUTH and SELECT at connection set-up are left out) and, for rueidislock, by a wrapper counting each Do call (rueidis pipelines concurrent calls on a connection itself, so that is an upper bound). ")
	p("Pub/sub messages are counted by a spy subscribed to every channel (PSUBSCRIBE *, on a client of its own): delivered is published times the channel's subscribers sampled mid-run. rueidislock wakes on client-side-caching invalidations instead, counted as received. ")
	p("Mutual exclusion is checked with an in-process counter of holders, across all Clients (they share the process here).\n")
	if res.spyErr != nil {
		p("\nThe pub/sub spy failed: %v\n", res.spyErr)
	}
	p("\nSettings:\n\n")
	for _, e := range res.entryNames {
		p("- **%s %s**: %s\n", e.lib, e.prim, e.settings)
	}
	p("- dlock Clients: dlock.New(go-redis client) with defaults. Every go-redis client: PoolSize %d.\n", poolSize)
	return b.String()
}

func zeros(xs []int) int {
	n := 0
	for _, x := range xs {
		if x == 0 {
			n++
		}
	}
	return n
}
