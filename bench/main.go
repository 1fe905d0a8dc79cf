// Command bench compares dlock with peer Go Redis lock libraries on a
// redis-server it starts for itself. Run it with `go run .` (about 3 minutes)
// or `go run . -quick` (a smoke run of about 25 seconds). It prints a table
// and writes BENCHMARKS.md and benchmarks.png next to itself.
//
// `go run . -only contention` runs the contention section alone (C Clients x
// G goroutines on one lock name; about a minute) and prints its table only,
// writing nothing; -cont-cohort adds Mutex rows WithCohort other bounds, and
// -cont-libs dlock runs dlock's rows only (Mutex, ReentrantMutex, RWMutex
// writers, Semaphore, Redlock). `go run . -only handoff` runs the handoff
// section alone: handoffs to a waiter on the same and on another Client
// (Mutex, ReentrantMutex, RWMutex writer; after a short and a 20ms hold), and
// a local (cohort) one, against a PING sent after the same idle pause,
// interleaved in one run. -cpuprofile writes a CPU profile of the run.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

type config struct {
	quick      bool
	rounds     int
	dur        time.Duration
	handoffs   int
	w1Workers  int
	w3Workers  int
	w3Hold     time.Duration
	w4Workers  int
	semPermits int
	semHold    time.Duration
	outDir     string
	only       string
	cont       contConfig
}

func main() {
	var cfg config
	flag.BoolVar(&cfg.quick, "quick", false, "smoke run: 3 rounds of 200ms, 60 handoffs")
	flag.IntVar(&cfg.rounds, "rounds", 0, "rounds per workload (default 9, quick 3)")
	flag.DurationVar(&cfg.dur, "dur", 0, "duration of one library's turn in a round (default 1s, quick 200ms)")
	flag.IntVar(&cfg.handoffs, "handoffs", 0, "W2 handoffs per library (default 200, quick 60)")
	flag.StringVar(&cfg.outDir, "out", ".", "directory for BENCHMARKS.md and benchmarks.png")
	flag.StringVar(&cfg.only, "only", "", `run one section alone and print its table, writing nothing: "contention", "uncontended" (W1), "redlock" (W1 and W2 over 3 and 5 masters, against redsync) or "handoff" (Mutex handoff to a waiter on the same and another Client, against the PING-after-idle floor)`)
	contClients := flag.String("cont-clients", "1,4,16", "contention: the numbers of Clients (processes) to run, comma-separated")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run (this process: the bench and the libraries under test) to this file")
	contLibs := flag.String("cont-libs", "", `contention: run only the rows of these libraries, comma-separated (e.g. "dlock"); default all`)
	contPrims := flag.String("cont-prims", "", `contention: run only the rows of these primitives, comma-separated, as the table names them (e.g. "ReentrantMutex,RWMutex (write)"); default all`)
	contCohort := flag.String("cont-cohort", "", "contention: WithCohort bounds (local handoffs) to run a Mutex row for besides the default's ("+strconv.Itoa(dlock.DefaultCohortHandoffs)+"), comma-separated")
	flag.IntVar(&cfg.cont.goroutines, "cont-goroutines", 4, "contention: goroutines per Client")
	flag.DurationVar(&cfg.cont.dur, "cont-dur", 0, "contention: measured duration of one run (default 3s, quick 600ms)")
	flag.DurationVar(&cfg.cont.warmup, "cont-warmup", 0, "contention: warm-up before each run (default 500ms, quick 200ms)")
	flag.DurationVar(&cfg.cont.hold, "cont-hold", time.Millisecond, "contention: hold (time.Sleep) per acquisition")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fatal(err)
		}
		defer func() { pprof.StopCPUProfile(); _ = f.Close() }()
	}
	switch cfg.only {
	case "", "contention", "uncontended", "redlock", "handoff":
	default:
		fatal(fmt.Errorf("-only %q: want contention, uncontended, redlock or handoff", cfg.only))
	}
	for f := range strings.SplitSeq(*contClients, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			fatal(fmt.Errorf("-cont-clients %q: want positive integers separated by commas", *contClients))
		}
		cfg.cont.clients = append(cfg.cont.clients, n)
	}
	contOnlyLibs = nil
	if *contLibs != "" {
		contOnlyLibs = strings.Split(*contLibs, ",")
	}
	contOnlyPrims = nil
	if *contPrims != "" {
		contOnlyPrims = strings.Split(*contPrims, ",")
	}
	cohortBounds = nil
	for f := range strings.SplitSeq(*contCohort, ",") {
		if *contCohort == "" {
			break
		}
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			fatal(fmt.Errorf("-cont-cohort %q: want positive integers separated by commas", *contCohort))
		}
		cohortBounds = append(cohortBounds, n)
	}
	if cfg.cont.goroutines <= 0 {
		fatal(fmt.Errorf("-cont-goroutines must be positive"))
	}
	def := func(v *int, normal, quick int) {
		if *v <= 0 {
			*v = normal
			if cfg.quick {
				*v = quick
			}
		}
	}
	def(&cfg.rounds, 9, 3)
	def(&cfg.handoffs, 200, 60)
	if cfg.dur <= 0 {
		cfg.dur = time.Second
		if cfg.quick {
			cfg.dur = 200 * time.Millisecond
		}
	}
	cfg.w1Workers, cfg.w3Workers, cfg.w3Hold = 32, 16, time.Millisecond
	cfg.w4Workers, cfg.semPermits, cfg.semHold = 16, 4, time.Millisecond
	if cfg.cont.dur <= 0 {
		cfg.cont.dur = 3 * time.Second
		if cfg.quick {
			cfg.cont.dur = 600 * time.Millisecond
		}
	}
	if cfg.cont.warmup <= 0 {
		cfg.cont.warmup = 500 * time.Millisecond
		if cfg.quick {
			cfg.cont.warmup = 200 * time.Millisecond
		}
	}

	dir, err := os.MkdirTemp("", "dlock-bench-")
	if err != nil {
		fatal(err)
	}
	srv, err := redistest.StartProcess(dir)
	if err != nil {
		fatal(fmt.Errorf("start redis-server: %w", err))
	}
	cleanup := func() { srv.Stop(); _ = os.RemoveAll(dir) }
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt)
	go func() { <-sig; cleanup(); os.Exit(130) }()

	if cfg.only == "uncontended" {
		res := &results{redisAddr: srv.Addr}
		for _, l := range append(libraries(), floors()...) {
			res.libs = append(res.libs, &libResult{lib: l})
		}
		runW1(cfg, srv.Addr, res)
		cleanup()
		floor := median(res.libs[len(res.libs)-2].w1Rates)
		fmt.Printf("\nW1 medians (ratio to %s):\n", res.libs[len(res.libs)-2].lib.name)
		for _, lr := range res.libs {
			fmt.Printf("  %-18s %9.0f pairs/s  %.2f  CPU per pair: client %s, redis-server %s\n", lr.lib.name, median(lr.w1Rates), median(lr.w1Rates)/floor,
				fmtDur(pct(lr.w1Client, .5)), fmtDur(pct(lr.w1Server, .5)))
		}
		if med, ahead, n := paired(res.find("dlock").w1Rates, res.find("minimal safe lock").w1Rates); n > 0 {
			fmt.Printf("dlock / minimal safe lock paired by round: median %.2f, level or ahead in %d of %d rounds\n", med, ahead, n)
		}
		return
	}
	if cfg.only == "redlock" {
		cleanup()
		table, err := runRedlock(cfg)
		if err != nil {
			fatal(err)
		}
		fmt.Printf("\n%s\n\n%s", envLine(machine()), table)
		return
	}
	if cfg.only == "handoff" {
		hr := runHandoff(srv.Addr, 3*cfg.handoffs, cfg.rounds)
		cleanup()
		fmt.Printf("\n%s\n\n%s", envLine(machine()), handoffTable(hr))
		return
	}
	if cfg.only == "contention" {
		cr := runContention(cfg.cont, srv.Addr)
		cleanup()
		fmt.Printf("\n%s\n\n%s\ntotal run time %v\n", envLine(machine()), contTable(cr), cr.elapsed.Round(time.Second))
		return
	}

	res, err := run(cfg, srv.Addr)
	cleanup()
	if err != nil {
		fatal(err)
	}
	res.redlock, err = runRedlock(cfg)
	if err != nil {
		fatal(err)
	}
	env := machine()
	printTable(os.Stdout, cfg, env, res)
	if err := writeMarkdown(cfg, env, res); err != nil {
		fatal(err)
	}
	if err := writeChart(cfg, res); err != nil {
		fatal(err)
	}
	fmt.Printf("\nwrote %s/BENCHMARKS.md and %s/benchmarks.png\n", cfg.outDir, cfg.outDir)
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "bench:", err)
	os.Exit(1)
}

type libResult struct {
	lib      lib
	openErr  error
	w1Rates  []float64
	w1Client []time.Duration // this process's CPU per pair, per round
	w1Server []time.Duration // redis-server's CPU per pair, per round
	w1Err    errBox
	w2       []time.Duration // from Unlock returning
	w2Call   []time.Duration // from Unlock being called
	w2Err    errBox
	w3Rates  []float64
	w3Waits  []time.Duration
	w3Holds  []time.Duration
	w3Viol   int64
	w3Err    errBox
	included bool // a lock library (W2, W3) rather than a floor
}

type results struct {
	libs      []*libResult // lock libraries then floors
	pingRTT   []time.Duration
	pingIdle  []time.Duration // PING after W2's idle pause
	rwRate    []float64
	rwRead    []time.Duration
	rwWrite   []time.Duration
	rwErr     errBox
	semRate   []float64
	semWaits  []time.Duration
	semErr    errBox
	scale     *scaleResult
	cont      *contResult
	handoff   *handoffResult
	redlock   string // the Redlock section's table (runRedlock), run after the rest
	redisAddr string
	elapsed   time.Duration
}

func (r *results) find(name string) *libResult {
	for _, l := range r.libs {
		if l.lib.name == name {
			return l
		}
	}
	return nil
}

// rotate returns xs rotated left by k, so each round starts with a
// different library.
func rotate[T any](xs []T, k int) []T {
	k %= len(xs)
	return append(append([]T{}, xs[k:]...), xs[:k]...)
}

// runW1 runs W1: every entry (libraries and floors), one instance each,
// shared by the goroutines; a short warm-up, then rounds in rotated order.
func runW1(cfg config, addr string, res *results) {
	fmt.Printf("W1 uncontended: %d goroutines, %d rounds x %v per entry\n", cfg.w1Workers, cfg.rounds, cfg.dur)
	insts := map[*libResult]instance{}
	adm := newGoRedis(addr)
	defer adm.Close()
	meter := cpuMeter{adm}
	for _, lr := range res.libs {
		inst, err := lr.lib.open(addr, nil)
		if err != nil {
			lr.openErr = err
			continue
		}
		insts[lr] = inst
		w1Round(inst, "warm:"+lr.lib.name, cfg.w1Workers, cfg.dur/4, &errBox{})
	}
	for r := range cfg.rounds {
		for _, lr := range rotate(res.libs, r) {
			if inst := insts[lr]; inst != nil {
				from := meter.mark()
				rate, pairs := w1Round(inst, lr.lib.name, cfg.w1Workers, cfg.dur, &lr.w1Err)
				cl, sv := meter.since(from, pairs)
				lr.w1Rates = append(lr.w1Rates, rate)
				lr.w1Client, lr.w1Server = append(lr.w1Client, cl), append(lr.w1Server, sv)
				fmt.Printf("  round %d %-18s %9.0f pairs/s\n", r+1, lr.lib.name, rate)
			}
		}
	}
	for _, inst := range insts {
		inst.Close()
	}

}

func run(cfg config, addr string) (*results, error) {
	t0 := time.Now()
	res := &results{redisAddr: addr}
	for _, l := range libraries() {
		res.libs = append(res.libs, &libResult{lib: l, included: true})
	}
	for _, l := range floors() {
		res.libs = append(res.libs, &libResult{lib: l})
	}

	runW1(cfg, addr, res)

	locks := res.libs[:len(libraries())]

	// W2: handoff latency, holder and waiter on separate instances.
	fmt.Printf("W2 handoff: %d handoffs per library over %d rounds\n", cfg.handoffs, cfg.rounds)
	type pair struct{ h, w instance }
	pairs := map[*libResult]pair{}
	for _, lr := range locks {
		if lr.openErr != nil {
			continue
		}
		h, err1 := lr.lib.open(addr, nil)
		w, err2 := lr.lib.open(addr, nil)
		if err1 != nil || err2 != nil {
			lr.openErr = fmt.Errorf("%v %v", err1, err2)
			continue
		}
		pairs[lr] = pair{h, w}
		w2Round(h, w, "warm:w2:"+lr.lib.name, 3, &errBox{})
	}
	for r := range cfg.rounds {
		per := cfg.handoffs / cfg.rounds // spread the remainder over the first rounds
		if r < cfg.handoffs%cfg.rounds {
			per++
		}
		for _, lr := range rotate(locks, r) {
			if p, ok := pairs[lr]; ok && per > 0 {
				ret, call := w2Round(p.h, p.w, "w2:"+lr.lib.name, per, &lr.w2Err)
				lr.w2, lr.w2Call = append(lr.w2, ret...), append(lr.w2Call, call...)
			}
		}
	}
	for _, p := range pairs {
		p.h.Close()
		p.w.Close()
	}
	ping := newGoRedis(addr)
	pingRTTs(ping, 50)
	res.pingRTT = pingRTTs(ping, max(200, cfg.handoffs))
	res.pingIdle = pingAfterIdle(ping, max(200, cfg.handoffs))
	_ = ping.Close()

	// W3: contention on one key.
	fmt.Printf("W3 contention: %d goroutines on one key, hold %v, %d rounds x %v\n", cfg.w3Workers, cfg.w3Hold, cfg.rounds, cfg.dur)
	insts := map[*libResult]instance{}
	for _, lr := range locks {
		if lr.openErr != nil {
			continue
		}
		inst, err := lr.lib.open(addr, nil)
		if err != nil {
			lr.openErr = err
			continue
		}
		insts[lr] = inst
		w3Round(inst, "warm:w3:"+lr.lib.name, cfg.w3Workers, cfg.w3Hold, cfg.dur/4, &errBox{})
	}
	for r := range cfg.rounds {
		for _, lr := range rotate(locks, r) {
			if inst := insts[lr]; inst != nil {
				w := w3Round(inst, "w3:"+lr.lib.name, cfg.w3Workers, cfg.w3Hold, cfg.dur, &lr.w3Err)
				lr.w3Rates = append(lr.w3Rates, w.rate)
				lr.w3Waits = append(lr.w3Waits, w.waits...)
				lr.w3Holds = append(lr.w3Holds, w.holds...)
				lr.w3Viol += w.violations
				fmt.Printf("  round %d %-18s %7.0f handoffs/s\n", r+1, lr.lib.name, w.rate)
			}
		}
	}
	for _, inst := range insts {
		inst.Close()
	}

	// W4: dlock only.
	fmt.Printf("W4 dlock RWMutex 90/10 (%d goroutines) and Semaphore N=%d (%d workers, hold %v)\n",
		cfg.w4Workers, cfg.semPermits, cfg.w4Workers, cfg.semHold)
	rdb := newGoRedis(addr)
	c := dlock.New(rdb)
	w4RW(c, "warm:w4rw", cfg.w4Workers, cfg.dur/4, &errBox{})
	for range cfg.rounds {
		rate, rl, wl := w4RW(c, "w4rw", cfg.w4Workers, cfg.dur, &res.rwErr)
		res.rwRate = append(res.rwRate, rate)
		res.rwRead, res.rwWrite = append(res.rwRead, rl...), append(res.rwWrite, wl...)
		rate, waits := w4Sem(c, "w4sem", cfg.semPermits, cfg.w4Workers, cfg.semHold, cfg.dur, &res.semErr)
		res.semRate = append(res.semRate, rate)
		res.semWaits = append(res.semWaits, waits...)
	}
	_ = c.Close()
	_ = rdb.Close()

	fmt.Printf("Scale: 10,000 held locks; 10,000 waiters on 1,000 keys\n")
	res.scale = runScale(addr, 10000, 10000, 1000)

	res.cont = runContention(cfg.cont, addr)
	res.handoff = runHandoff(addr, 3*cfg.handoffs, cfg.rounds)
	res.elapsed = time.Since(t0)
	return res, nil
}
