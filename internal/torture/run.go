package torture

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/torture/check"
	"github.com/dlock-go/dlock/internal/torture/history"
)

// semaphoreTotal is the total of every semaphore a run uses.
const semaphoreTotal = 3

// Result is what a run found.
type Result struct {
	Report  check.Report
	History string  // the merged history file
	Faults  []error // faults the nemesis could not inject or end
}

// OK reports whether the run found nothing wrong.
func (r Result) OK() bool { return r.Report.OK() && len(r.Faults) == 0 }

// Run runs the torture test cfg describes and checks its history. The
// error is for a run that could not be carried out (servers that did not
// start, a worker that would not run); what the run found is in the
// Result.
func Run(cfg Config) (Result, error) {
	if err := cfg.validate(); err != nil {
		return Result{}, err
	}
	redis.SetLogger(quiet{}) // the nemesis's failovers and restarts are in the history
	logf := cfg.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if err := os.MkdirAll(cfg.OutDir, 0o755); err != nil {
		return Result{}, err
	}
	dir, err := os.MkdirTemp("", "dlock-torture-*")
	if err != nil {
		return Result{}, err
	}
	defer os.RemoveAll(dir)
	srv, err := startServers(cfg, dir)
	if err != nil {
		return Result{}, fmt.Errorf("start servers: %w", err)
	}
	defer srv.stop()

	rec, err := history.NewRecorder(filepath.Join(cfg.OutDir, "nemesis.jsonl"), -1)
	if err != nil {
		return Result{}, err
	}
	defer rec.Close()
	setting := func(name string, v int64) {
		rec.Record(history.Event{ID: rec.NextID(), Kind: history.Point, Prim: history.Nemesis, F: history.Setting, Name: name, N: v})
	}
	setting("lease", cfg.Lease.Milliseconds())
	setting("period", (cfg.Lease / 3).Milliseconds())
	if cfg.has(history.Semaphore) {
		if err := setTotals(cfg, srv, setting); err != nil {
			return Result{}, err
		}
	}

	workers, stdins, paths, err := startWorkers(cfg, srv)
	if err != nil {
		return Result{}, err
	}
	procs := make([]*os.Process, len(workers))
	for i, w := range workers {
		procs[i] = w.Process
	}
	nem := newNemesis(cfg, rec, srv, procs)
	if cfg.has(history.Semaphore) {
		nem.restarted = func() error { return setTotals(cfg, srv, setting) }
	}
	logf("torture: seed %d, %d workers x %d goroutines, lease %v, %v of faults (%s) then %v quiet",
		cfg.Seed, cfg.Workers, cfg.Goroutines, cfg.Lease, cfg.Duration, strings.Join(nem.faults, ","), cfg.Quiet)
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Duration)
	nem.run(ctx)
	cancel()
	nem.healAll()
	rec.Record(history.Event{ID: rec.NextID(), Kind: history.Point, Prim: history.Nemesis, F: history.QuietStart})
	logf("torture: faults over; quiet for %v", cfg.Quiet)
	time.Sleep(cfg.Quiet)

	logf("torture: stopping the workers")
	for _, in := range stdins {
		_ = in.Close()
	}
	var exitErrs []string
	for i, w := range workers {
		done := make(chan error, 1)
		go func() { done <- w.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				exitErrs = append(exitErrs, fmt.Sprintf("worker %d: %v", i, err))
			}
		case <-time.After(90 * time.Second):
			_ = w.Process.Kill()
			<-done
			exitErrs = append(exitErrs, fmt.Sprintf("worker %d did not stop within 90s; killed", i))
		}
	}
	final(cfg, srv, rec, logf)
	if err := rec.Flush(); err != nil {
		return Result{}, err
	}
	evs, err := history.Load(append(paths, filepath.Join(cfg.OutDir, "nemesis.jsonl"))...)
	if err != nil {
		return Result{}, err
	}
	merged := filepath.Join(cfg.OutDir, "history.jsonl")
	if f, err := os.Create(merged); err == nil {
		_ = history.WriteAll(f, evs)
		_ = f.Close()
	}
	logf("torture: checking %d events", len(evs))
	rep := check.Check(evs, check.Options{Lease: cfg.Lease, OutDir: cfg.OutDir})
	res := Result{Report: rep, History: merged, Faults: nem.errs}
	for _, e := range exitErrs {
		res.Faults = append(res.Faults, fmt.Errorf("%s", e))
	}
	if err := os.WriteFile(filepath.Join(cfg.OutDir, "report.txt"), []byte(res.String(cfg)), 0o644); err != nil {
		return res, err
	}
	return res, nil
}

// String is the run's report: its settings, what the checkers found, and
// how to replay it.
func (r Result) String(cfg Config) string {
	var b strings.Builder
	fmt.Fprintf(&b, "dlock torture run, seed %d: %d workers x %d goroutines, lease %v, %v of faults then %v quiet\n",
		cfg.Seed, cfg.Workers, cfg.Goroutines, cfg.Lease, cfg.Duration, cfg.Quiet)
	fmt.Fprintf(&b, "primitives: %s\nfaults: %s\n\n", strings.Join(cfg.Prims, ","), strings.Join(cfg.Faults, ","))
	b.WriteString(r.Report.String())
	for _, err := range r.Faults {
		fmt.Fprintf(&b, "run problem: %v\n", err)
	}
	if r.OK() {
		b.WriteString("\nresult: OK\n")
	} else {
		fmt.Fprintf(&b, "\nresult: FAILED; replay the schedule with -seed %d; history in %s\n", cfg.Seed, r.History)
	}
	return b.String()
}

// setTotals sets the total of every semaphore the workers use.
func setTotals(cfg Config, srv *servers, setting func(string, int64)) error {
	rdb := redis.NewClient(&redis.Options{Addr: srv.main.Addr})
	defer rdb.Close()
	c := dlock.New(rdb)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range cfg.Names {
		name := fmt.Sprintf("%s%d", history.Semaphore, i)
		if err := c.Semaphore(name).SetPermits(ctx, semaphoreTotal); err != nil {
			return err
		}
		setting("total:"+name, semaphoreTotal)
	}
	return nil
}

// startWorkers starts the worker processes: this binary again, with the
// worker's spec in its environment.
func startWorkers(cfg Config, srv *servers) (workers []*exec.Cmd, stdins []io.WriteCloser, paths []string, err error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, nil, nil, err
	}
	for i := range cfg.Workers {
		spec := workerSpec{
			Proc: i, Seed: cfg.Seed, Goroutines: cfg.Goroutines, Lease: cfg.Lease, Prims: cfg.Prims, Names: cfg.Names,
			Main: srv.proxies[i][0].Addr, Fence: srv.fence.Addr, BreakLost: cfg.BreakLost,
			History: filepath.Join(cfg.OutDir, fmt.Sprintf("worker%d.jsonl", i)),
		}
		for _, p := range srv.proxies[i][1:] {
			spec.Redlock = append(spec.Redlock, p.Addr)
		}
		if srv.sent != nil {
			spec.Sentinel, spec.MasterName = srv.sent.addr, masterName
		}
		js, _ := json.Marshal(spec)
		cmd := exec.Command(exe)
		cmd.Env = append(os.Environ(), WorkerEnv+"="+string(js))
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			return nil, nil, nil, err
		}
		if err := cmd.Start(); err != nil {
			return nil, nil, nil, err
		}
		workers, stdins, paths = append(workers, cmd), append(stdins, in), append(paths, spec.History)
	}
	return workers, stdins, paths, nil
}

// final records what the checkers need from after the run: each
// semaphore's free permits, and every key left without an expiry that no
// primitive promises to keep.
func final(cfg Config, srv *servers, rec *history.Recorder, logf func(string, ...any)) {
	point := func(f, name string, n int64) {
		rec.Record(history.Event{ID: rec.NextID(), Kind: history.Point, Prim: history.Nemesis, F: f, Name: name, N: n})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rdb := redis.NewClient(&redis.Options{Addr: srv.main.Addr})
	defer rdb.Close()
	if cfg.has(history.Semaphore) {
		c := dlock.New(rdb)
		for i := range cfg.Names {
			name := fmt.Sprintf("%s%d", history.Semaphore, i)
			// Permits of a worker that crashed or was cut off come back
			// when their lease runs out: give them that long.
			var free int
			deadline := time.Now().Add(2 * cfg.Lease)
			for {
				n, err := c.Semaphore(name).Available(ctx)
				if err != nil {
					logf("torture: available %s: %v", name, err)
				}
				free = n
				if n == semaphoreTotal || time.Now().After(deadline) {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			point(history.FinalAvailable, name, int64(free))
		}
		_ = c.Close()
	}
	scan := func(server string, addr string) {
		r := redis.NewClient(&redis.Options{Addr: addr})
		defer r.Close()
		it := r.Scan(ctx, 0, "*", 1000).Iterator()
		for it.Next(ctx) {
			k := it.Val()
			ttl, err := r.PTTL(ctx, k).Result()
			if err != nil || ttl != -1 {
				continue
			}
			if kept(ctx, r, k) {
				continue
			}
			point(history.KeyWithoutTTL, server+":"+k, 0)
			logf("torture: %s: key %q has no expiry", server, k)
		}
	}
	scan("main", srv.main.Addr)
	for i, m := range srv.masters {
		scan(fmt.Sprintf("master%d", i), m.Addr)
	}
	if srv.sent != nil {
		if m, err := srv.sent.master(ctx); err == nil {
			scan("sentinel", m.Addr)
		}
	}
}

// kept reports whether key is one a primitive's docs promise to keep
// without an expiry: a Semaphore's keys once its total is set, and a
// latch, both without an idle expiry.
func kept(ctx context.Context, r *redis.Client, key string) bool {
	main := key
	if i := strings.LastIndex(key, "}"); i >= 0 {
		main = key[:i+1]
	}
	v, err := r.HMGet(ctx, main, "k", "total").Result()
	if err != nil || len(v) != 2 {
		return false
	}
	switch v[0] {
	case "semaphore":
		return v[1] != nil
	case "latch":
		return key == main
	}
	return false
}
