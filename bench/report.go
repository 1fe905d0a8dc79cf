package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

type envInfo struct {
	nproc, cpu, goVersion, redis, date string
}

func machine() envInfo {
	e := envInfo{goVersion: runtime.Version(), date: time.Now().UTC().Format("2006-01-02 15:04 MST")}
	if out, err := exec.Command("nproc").Output(); err == nil {
		e.nproc = strings.TrimSpace(string(out))
	} else {
		e.nproc = fmt.Sprint(runtime.NumCPU())
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				e.cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	if e.cpu == "" {
		e.cpu = "unknown"
	}
	if out, err := exec.Command("redis-server", "--version").Output(); err == nil {
		e.redis = strings.TrimSpace(string(out))
		for f := range strings.FieldsSeq(e.redis) {
			if v, ok := strings.CutPrefix(f, "v="); ok {
				e.redis = "redis-server " + v
			}
		}
	}
	return e
}

func fmtDur(d time.Duration) string {
	switch {
	case d < 0:
		return "-" + fmtDur(-d)
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond))
	default:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	}
}

func errCell(e *errBox, openErr error) string {
	if openErr != nil {
		return "open failed: " + openErr.Error()
	}
	if s := e.String(); s != "" {
		return strings.ReplaceAll(s, "|", "/")
	}
	return "0"
}

// tables renders the results as Markdown tables.
func tables(cfg config, res *results) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	ping := res.find("PING floor")
	pingMed := 0.0
	if ping != nil {
		pingMed = median(ping.w1Rates)
	}

	p("### W1 uncontended: %d goroutines on distinct keys, Lock+Unlock pairs, %d rounds x %v, median\n\n", cfg.w1Workers, cfg.rounds, cfg.dur)
	p("CPU per pair is the median over rounds of this process's CPU (getrusage) and redis-server's (INFO cpu) during the entry's turn, divided by its pairs; the two share the machine's cores.\n\n")
	p("| entry | pairs/s (median) | min..max over rounds | ratio to PING floor | client CPU / pair | redis-server CPU / pair | errors |\n|---|--:|--:|--:|--:|--:|---|\n")
	for _, lr := range res.libs {
		m := median(lr.w1Rates)
		lo, hi := 0.0, 0.0
		if len(lr.w1Rates) > 0 {
			lo, hi = lr.w1Rates[0], lr.w1Rates[0]
			for _, x := range lr.w1Rates {
				lo, hi = min(lo, x), max(hi, x)
			}
		}
		ratio := "-"
		if pingMed > 0 {
			ratio = fmt.Sprintf("%.2f", m/pingMed)
		}
		p("| %s | %.0f | %.0f..%.0f | %s | %s | %s | %s |\n", lr.lib.name, m, lo, hi, ratio,
			fmtDur(pct(lr.w1Client, .5)), fmtDur(pct(lr.w1Server, .5)), errCell(&lr.w1Err, lr.openErr))
	}

	if d, f := res.find("dlock"), res.find("minimal safe lock"); d != nil && f != nil {
		if med, ahead, n := paired(d.w1Rates, f.w1Rates); n > 0 {
			p("\nPaired by round (dlock's and the minimal safe lock's turns of the same round, so that the machine's drift over the run cancels): dlock / minimal safe lock, median over rounds **%.2f**; dlock at least level in %d of %d rounds.\n", med, ahead, n)
		}
	}

	p("\n### W2 handoff latency: one holder, one blocked waiter (separate clients), %d handoffs\n\n", cfg.handoffs)
	p("Measured from the holder's Unlock returning (the issue's definition; negative when the waiter's Lock returned first) and, to compare libraries on a figure that cannot go negative, from the holder calling Unlock.\n\n")
	p("| library | p50 | p99 | max | waiter first | from Unlock call: p50 | p99 | n | errors |\n|---|--:|--:|--:|--:|--:|--:|--:|---|\n")
	for _, lr := range res.libs {
		if !lr.included {
			continue
		}
		first := 0
		for _, d := range lr.w2 {
			if d < 0 {
				first++
			}
		}
		p("| %s | %s | %s | %s | %d | %s | %s | %d | %s |\n", lr.lib.name, fmtDur(pct(lr.w2, .5)), fmtDur(pct(lr.w2, .99)), fmtDur(pct(lr.w2, 1)),
			first, fmtDur(pct(lr.w2Call, .5)), fmtDur(pct(lr.w2Call, .99)), len(lr.w2), errCell(&lr.w2Err, lr.openErr))
	}
	p("| (PING round trip, go-redis) | | | | | %s | %s | %d | |\n", fmtDur(pct(res.pingRTT, .5)), fmtDur(pct(res.pingRTT, .99)), len(res.pingRTT))
	p("| (PING after the same 3-5 ms idle pause) | | | | | %s | %s | %d | |\n", fmtDur(pct(res.pingIdle, .5)), fmtDur(pct(res.pingIdle, .99)), len(res.pingIdle))
	p("\nFrom the Unlock call, a handoff cannot beat one round trip made from idle (the holder slept before Unlock, as W2's does), plus the wake-up of the waiter's connection: the last row is that round trip alone.\n")

	p("\n### W3 contention: %d goroutines on one key, hold %v, %d rounds x %v\n\n", cfg.w3Workers, cfg.w3Hold, cfg.rounds, cfg.dur)
	p("| library | handoffs/s (median) | wait p50 | wait p99 | hold as slept p50 / p99 | mutual-exclusion violations | errors |\n|---|--:|--:|--:|--:|--:|---|\n")
	for _, lr := range res.libs {
		if !lr.included {
			continue
		}
		p("| %s | %.0f | %s | %s | %s / %s | %d | %s |\n", lr.lib.name, median(lr.w3Rates), fmtDur(pct(lr.w3Waits, .5)), fmtDur(pct(lr.w3Waits, .99)),
			fmtDur(pct(lr.w3Holds, .5)), fmtDur(pct(lr.w3Holds, .99)), lr.w3Viol, errCell(&lr.w3Err, nil))
	}
	p("\nIdeal for a %v hold is just under %.0f handoffs/s. The hold is time.Sleep(%v), which this machine overshoots (column \"hold as slept\").\n", cfg.w3Hold, float64(time.Second)/float64(cfg.w3Hold), cfg.w3Hold)

	p("\n### W4 dlock only (redsync, redislock and rueidislock have no RWMutex or Semaphore)\n\n")
	all := append(append([]time.Duration{}, res.rwRead...), res.rwWrite...)
	p("| workload | ops/s (median) | p50 | p99 | errors |\n|---|--:|--:|--:|---|\n")
	p("| RWMutex 90%% RLock+RUnlock / 10%% Lock+Unlock, %d goroutines, no hold | %.0f | %s | %s | %s |\n",
		cfg.w4Workers, median(res.rwRate), fmtDur(pct(all, .5)), fmtDur(pct(all, .99)), errCell(&res.rwErr, nil))
	p("| ... reads only | | %s | %s | |\n", fmtDur(pct(res.rwRead, .5)), fmtDur(pct(res.rwRead, .99)))
	p("| ... writes only | | %s | %s | |\n", fmtDur(pct(res.rwWrite, .5)), fmtDur(pct(res.rwWrite, .99)))
	p("| Semaphore N=%d, %d workers, Acquire(1) hold %v Release (acquisitions/s; wait) | %.0f | %s | %s | %s |\n",
		cfg.semPermits, cfg.w4Workers, cfg.semHold, median(res.semRate), fmtDur(pct(res.semWaits, .5)), fmtDur(pct(res.semWaits, .99)), errCell(&res.semErr, nil))
	p("\nIdeal for the semaphore is just under %.0f acquisitions/s.\n", float64(cfg.semPermits)*float64(time.Second)/float64(cfg.semHold))

	if sc := res.scale; sc != nil {
		p("\n### Scale (dlock only)\n\n")
		p("| figure | value |\n|---|--:|\n")
		p("| held locks, renewed by one Client's watchdog | %d |\n", sc.holds)
		p("| renewal round trips per watchdog period (%v period, counted over %d periods by a go-redis hook) | %.1f |\n", sc.period, sc.periods, float64(sc.renewTrips)/float64(sc.periods))
		p("| renewal script calls per period (up to 100 keys each, pipelined) | %.1f |\n", float64(sc.renewCalls)/float64(sc.periods))
		p("| client heap per held lock (Mutex handle and hold record; live heap after GC) | %.0f B |\n", sc.heapPerHold)
		p("| blocked waiters, on %d keys, through one Client | %d |\n", sc.keys, sc.waiters)
		p("| pub/sub connections on the server (CLIENT LIST TYPE pubsub; the holders' Client has none) | %d |\n", sc.pubsubConns)
		p("| client heap per waiter (live heap after GC) | %.0f B |\n", sc.heapPerWaiter)
		p("| ... plus the blocked goroutine's stack | %.0f B |\n", sc.stackPerWaiter)
		p("| time for all waiters to be served after releasing the %d locks (each waiter locks, then unlocks) | %s |\n", sc.keys, fmtDur(sc.served))
		if e := sc.err.String(); e != "" {
			p("| errors | %s |\n", e)
		}
	}
	if res.cont != nil {
		p("\n%s", contTable(res.cont))
	}
	if res.handoff != nil {
		p("\n%s", handoffTable(res.handoff))
	}
	if res.redlock != "" {
		p("\n%s", res.redlock)
	}
	return b.String()
}

func settings(res *results) string {
	var b strings.Builder
	for _, lr := range res.libs {
		fmt.Fprintf(&b, "- **%s**: %s\n", lr.lib.name, lr.lib.settings)
	}
	fmt.Fprintf(&b, "- Every go-redis client: PoolSize %d. Each library's turn uses one instance (one client) shared by the goroutines; W2 uses two instances (holder, waiter).\n", poolSize)
	return b.String()
}

func printTable(w io.Writer, cfg config, env envInfo, res *results) {
	fmt.Fprintf(w, "\n%s\n%s", envLine(env), tables(cfg, res))
	fmt.Fprintf(w, "\n%s", targets(cfg, res))
	fmt.Fprintf(w, "\ntotal run time %v\n", res.elapsed.Round(time.Second))
}

func envLine(e envInfo) string {
	return fmt.Sprintf("machine: %s cores (nproc), %s; %s; %s; %s", e.nproc, e.cpu, e.goVersion, e.redis, e.date)
}

func writeMarkdown(cfg config, env envInfo, res *results) error {
	mode := "normal"
	if cfg.quick {
		mode = "quick (-quick)"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# dlock benchmarks versus peer libraries\n\n")
	fmt.Fprintf(&b, "Generated by `cd bench && go run .%s` (mode: %s). Do not edit by hand.\n\n", map[bool]string{true: " -quick"}[cfg.quick], mode)
	fmt.Fprintf(&b, "## Machine\n\n- nproc: %s\n- CPU: %s\n- Go: %s\n- Redis: %s (its own redis-server on a free loopback port, no persistence)\n- Date: %s\n- Total run time: %v\n\n",
		env.nproc, env.cpu, env.goVersion, env.redis, env.date, res.elapsed.Round(time.Second))
	fmt.Fprintf(&b, "## Settings\n\n%s\n", settings(res))
	fmt.Fprintf(&b, "Rounds run every library in turn, the order rotated each round, so drift in the machine's speed spreads over all of them. Each library gets a short warm-up first. The client, the benchmark and redis-server share the machine's %s cores, so figures are relative, not absolute.\n\n", env.nproc)
	fmt.Fprintf(&b, "## Targets (DESIGN.md)\n\n%s\n", targets(cfg, res))
	fmt.Fprintf(&b, "## Results\n\n%s\n![W1 ratios and W2 p50](benchmarks.png)\n", tables(cfg, res))
	return os.WriteFile(filepath.Join(cfg.outDir, "BENCHMARKS.md"), []byte(b.String()), 0o644)
}

// targets checks the DESIGN.md targets against this run's figures.
func targets(cfg config, res *results) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	d := res.find("dlock")
	ping, floor := res.find("PING floor"), res.find("minimal safe lock")
	if d == nil || ping == nil || floor == nil || median(ping.w1Rates) == 0 {
		return "targets: not computed (missing entries)\n"
	}
	pingMed := median(ping.w1Rates)
	var bestW1, bestW3 float64
	var bestW1Name, bestW2Name, bestW3Name string
	bestW2 := time.Duration(0)
	for _, lr := range res.libs {
		if !lr.included || lr.lib.name == "dlock" {
			continue
		}
		if r := median(lr.w1Rates) / pingMed; r > bestW1 {
			bestW1, bestW1Name = r, lr.lib.name
		}
		if p50 := pct(lr.w2Call, .5); p50 > 0 && (bestW2 == 0 || p50 < bestW2) {
			bestW2, bestW2Name = p50, lr.lib.name
		}
		if r := median(lr.w3Rates); r > bestW3 {
			bestW3, bestW3Name = r, lr.lib.name
		}
	}
	dW1, fW1 := median(d.w1Rates)/pingMed, median(floor.w1Rates)/pingMed
	dW2, dW2Call := pct(d.w2, .5), pct(d.w2Call, .5)
	dW3, dW3p99 := median(d.w3Rates), pct(d.w3Waits, .99)
	limit := time.Duration(2*cfg.w3Workers) * cfg.w3Hold
	p("| target | this run | verdict |\n|---|---|---|\n")
	p("| W1 at least the minimal safe lock | dlock %.2f, floor %.2f (of PING) | %s |\n", dW1, fW1, verdict(dW1 >= fW1))
	if med, ahead, n := paired(d.w1Rates, floor.w1Rates); n > 0 {
		p("| W1 at least the minimal safe lock, paired by round | dlock / floor median %.2f, level or ahead in %d of %d rounds | %s |\n", med, ahead, n, verdict(med >= 1))
	}
	p("| W1 ahead of every peer | dlock %.2f, best peer %s %.2f | %s |\n", dW1, bestW1Name, bestW1, verdict(dW1 > bestW1))
	p("| W2 handoff p50 <= 150 µs | %s | %s |\n", fmtDur(dW2), verdict(dW2 <= 150*time.Microsecond))
	if bestW2 > 0 && dW2Call > 0 {
		p("| W2 at least 3x faster than the best peer (p50 from the Unlock call) | %.2fx (dlock %s, best peer %s %s) | %s |\n", float64(bestW2)/float64(dW2Call), fmtDur(dW2Call), bestW2Name, fmtDur(bestW2), verdict(3*dW2Call <= bestW2))
	}
	if bestW3 > 0 {
		p("| W3 at least 1.15x the best peer's handoffs/s | %.2fx (%.0f vs %s %.0f) | %s |\n", dW3/bestW3, dW3, bestW3Name, bestW3, verdict(dW3 >= 1.15*bestW3))
	}
	p("| W3 wait p99 <= 2 x workers x hold (%v) | %s | %s |\n", limit, fmtDur(dW3p99), verdict(dW3p99 <= limit))
	if h := res.handoff; h != nil {
		handoffTargets(p, h)
	}
	if sc := res.scale; sc != nil {
		trips := float64(sc.renewTrips) / float64(sc.periods)
		p("| <= 100 round trips per watchdog period for %d held locks | %.1f | %s |\n", sc.holds, trips, verdict(trips <= 100 && sc.err.String() == ""))
		p("| one pub/sub connection per Client for %d waiters | %d | %s |\n", sc.waiters, sc.pubsubConns, verdict(sc.pubsubConns == 1 && sc.err.String() == ""))
	}
	return b.String()
}

// handoffTargets adds the handoff section's targets after a long hold:
// to another Client, at most 0.7 of the best peer's (rueidislock with one
// key, the only peer the section runs), beside the least a handoff by
// message can take; to the same Client, at most 1.25 PINGs after the same
// idle.
func handoffTargets(p func(string, ...any), h *handoffResult) {
	var cross, same, peer time.Duration
	for _, r := range h.rows {
		switch {
		case r.hold == 0:
		case strings.HasPrefix(r.name, "rueidislock"):
			peer = pct(r.fromCall, .5)
		case strings.HasPrefix(r.name, "Mutex, waiter on another Client"):
			cross = pct(r.fromCall, .5)
		case strings.HasPrefix(r.name, "Mutex, waiter on the same Client"):
			same = pct(r.fromCall, .5)
		}
	}
	if cross > 0 && peer > 0 {
		pub := pct(h.publishLong, .5)
		p("| handoff to another Client after a %v hold <= 0.7x the best peer's (p50) | %.2fx (dlock %s, rueidislock-1key %s; a script that only publishes: %s, %.2fx) | %s |\n",
			longHold, float64(cross)/float64(peer), fmtDur(cross), fmtDur(peer), fmtDur(pub), float64(pub)/float64(peer), verdict(float64(cross) <= 0.7*float64(peer)))
	}
	if floor := pct(h.floorLong, .5); same > 0 && floor > 0 {
		p("| handoff to the same Client after a %v hold <= 1.25x a PING after the same idle (p50) | %.2fx (%s vs %s) | %s |\n",
			longHold, float64(same)/float64(floor), fmtDur(same), fmtDur(floor), verdict(float64(same) <= 1.25*float64(floor)))
	}
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "**not met**"
}

// paired compares two entries' W1 rounds one by one: the median over rounds
// of a's rate over b's, and in how many of the n rounds a was at least b.
func paired(a, b []float64) (med float64, ahead, n int) {
	n = min(len(a), len(b))
	ratios := make([]float64, 0, n)
	for i := range n {
		if b[i] > 0 {
			ratios = append(ratios, a[i]/b[i])
			if a[i] >= b[i] {
				ahead++
			}
		}
	}
	return median(ratios), ahead, len(ratios)
}
