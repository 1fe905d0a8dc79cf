// Command dlock-torture is dlock's torture test: worker processes run
// random workloads on every primitive against real redis-server processes,
// through fault-injecting proxies, while a nemesis injects faults on a
// random schedule; the whole history is then checked (see RELIABILITY.md).
//
// Usage:
//
//	go run ./cmd/dlock-torture [-duration 1m] [-seed N] [-workers 4] [-goroutines 4]
//	    [-lease 1s] [-prims all] [-faults all] [-names 3] [-out torture-out]
//	go run ./cmd/dlock-torture -check torture-out/history.jsonl [-out dir]
//
// With -check it runs no workload: it checks a history recorded before (for
// instance after a change to the checkers), and exits as a run would.
//
// It needs redis-server on PATH. It exits 0 when every checker passed, 1
// when one found a violation (the report says which, and the seed that
// replays the schedule), and 2 for bad flags or a run that could not be
// carried out. The history, the report and, for a failing linearizability
// check, porcupine's visualization are written to -out.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/dlock-go/dlock/internal/torture"
	"github.com/dlock-go/dlock/internal/torture/check"
	"github.com/dlock-go/dlock/internal/torture/history"
)

func main() {
	if torture.IsWorker() {
		os.Exit(torture.WorkerMain())
	}
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	cfg := torture.DefaultConfig()
	fs := flag.NewFlagSet("dlock-torture", flag.ContinueOnError)
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "how long the nemesis injects faults")
	fs.DurationVar(&cfg.Quiet, "quiet", cfg.Quiet, "how long the workloads go on once every fault healed")
	fs.Int64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the schedule (default: the time)")
	fs.IntVar(&cfg.Workers, "workers", cfg.Workers, "worker processes")
	fs.IntVar(&cfg.Goroutines, "goroutines", cfg.Goroutines, "goroutines per worker")
	fs.DurationVar(&cfg.Lease, "lease", cfg.Lease, "the workers' watchdog timeout (lease)")
	fs.IntVar(&cfg.Names, "names", cfg.Names, "names per primitive")
	fs.StringVar(&cfg.OutDir, "out", cfg.OutDir, "directory for the history and the report")
	prims := fs.String("prims", "all", "primitives, comma-separated: "+strings.Join(torture.AllPrims, ","))
	faults := fs.String("faults", "all", "faults, comma-separated, or none: "+strings.Join(torture.AllFaults, ","))
	recheck := fs.String("check", "", "check this recorded history (history.jsonl) instead of running")
	fs.BoolVar(&cfg.BreakLost, "break-lost", false, "workers are never told of a lost hold, as if dlock failed to say (to see the checkers catch it)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var err error
	if *recheck != "" {
		return checkFile(*recheck, cfg)
	}
	if cfg.Prims, err = torture.ParseList(*prims, torture.AllPrims); err != nil {
		fmt.Fprintln(os.Stderr, "dlock-torture: -prims:", err)
		return 2
	}
	if cfg.Faults, err = torture.ParseList(*faults, torture.AllFaults); err != nil {
		fmt.Fprintln(os.Stderr, "dlock-torture: -faults:", err)
		return 2
	}
	start := time.Now()
	cfg.Logf = func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "%6.1fs "+format+"\n", append([]any{time.Since(start).Seconds()}, args...)...)
	}
	res, err := torture.Run(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dlock-torture:", err)
		return 2
	}
	fmt.Print(res.String(cfg))
	if !res.OK() {
		return 1
	}
	return 0
}

// checkFile checks the history at path, as a run checks its own: the
// lease and period come from the history's settings.
func checkFile(path string, cfg torture.Config) int {
	evs, err := history.Load(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dlock-torture:", err)
		return 2
	}
	rep := check.Check(evs, check.Options{OutDir: cfg.OutDir})
	fmt.Print(rep.String())
	if !rep.OK() {
		fmt.Println("\nresult: FAILED")
		return 1
	}
	fmt.Println("\nresult: OK")
	return 0
}
