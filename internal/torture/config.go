// Package torture is dlock's own Jepsen: worker OS processes run random
// workloads on every primitive against real redis-server processes, each
// through a fault-injecting proxy, while a nemesis injects faults on a
// random schedule; every operation is recorded in a history on one clock
// (package history), and the whole history is checked against models
// (package check).
//
// The controller (Run) owns the servers, the proxies, the worker processes
// and the nemesis; it runs the same binary again as each worker (see
// WorkerEnv). A run is reproducible in its schedule from its seed: the
// nemesis and every worker draw from generators seeded by it. Timing on a
// real machine is not reproducible, which is the point.
//
// What a worker does is in worker.go and workloads.go, the faults in
// nemesis.go, the servers in servers.go, and the controller in run.go.
package torture

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/dlock-go/dlock/internal/torture/history"
)

// Config is one torture run.
type Config struct {
	Duration   time.Duration // how long the nemesis runs; a quiet phase follows
	Quiet      time.Duration // the quiet phase: faults healed, workloads go on
	Seed       int64
	Workers    int           // worker processes
	Goroutines int           // per worker
	Lease      time.Duration // the workers' watchdog timeout
	Prims      []string      // primitives the workloads use (history.Mutex, ...)
	Faults     []string      // nemesis faults (see AllFaults)
	Names      int           // names per primitive: fewer means more contention
	OutDir     string        // histories, report, visualizations
	// BreakLost makes the workers deaf to Lost: they record none, and go
	// on holding and writing until they unlock, as if dlock had never told
	// them. It stands for a lock library that fails to warn its holders, to
	// show that the checkers catch one. Never set it but to test the suite.
	BreakLost bool
	Logf      func(format string, args ...any) // progress; nil: silent
}

// AllPrims are the primitives a run exercises by default.
var AllPrims = []string{
	history.Mutex, history.MutexNoCohort, history.MultiLock, history.HandOver, history.Reentrant,
	history.RW, history.Semaphore, history.Latch, history.Election, history.Redlock, history.Sentinel,
}

// The faults the nemesis can inject.
const (
	FaultPause      = "pause"       // SIGSTOP a worker past its lease, then SIGCONT
	FaultPartition  = "partition"   // a worker's connections blackholed
	FaultLatency    = "latency"     // a worker's connections slowed, up to 40% of the lease a round trip
	FaultReset      = "reset"       // a worker's connections dropped
	FaultRestart    = "restart"     // the main redis-server killed and restarted empty
	FaultFlush      = "scriptflush" // SCRIPT FLUSH on the main server
	FaultPubSub     = "pubsub"      // CLIENT KILL TYPE pubsub on the main server
	FaultFailover   = "failover"    // a Sentinel failover
	FaultMasterStop = "masterpause" // SIGSTOP a Redlock master, then SIGCONT
	FaultMasterKill = "masterkill"  // kill a Redlock master, restart it empty after the longest lease
)

// AllFaults are the faults a run injects by default.
var AllFaults = []string{
	FaultPause, FaultPartition, FaultLatency, FaultReset, FaultRestart, FaultFlush, FaultPubSub,
	FaultFailover, FaultMasterStop, FaultMasterKill,
}

// DefaultConfig is a run of every primitive under every fault.
func DefaultConfig() Config {
	return Config{
		Duration:   time.Minute,
		Quiet:      5 * time.Second,
		Seed:       time.Now().UnixNano(),
		Workers:    4,
		Goroutines: 4,
		Lease:      time.Second,
		Prims:      slices.Clone(AllPrims),
		Faults:     slices.Clone(AllFaults),
		Names:      3,
		OutDir:     "torture-out",
	}
}

// ParseList reads a comma-separated list of primitives or faults, checking
// each against all ("all" is all of them).
func ParseList(s string, all []string) ([]string, error) {
	if s == "all" {
		return slices.Clone(all), nil
	}
	if s == "" || s == "none" {
		return nil, nil
	}
	var out []string
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if !slices.Contains(all, p) {
			return nil, fmt.Errorf("%q is not one of %s", p, strings.Join(all, ", "))
		}
		out = append(out, p)
	}
	return out, nil
}

func (c Config) has(prim string) bool { return slices.Contains(c.Prims, prim) }

func (c Config) validate() error {
	switch {
	case c.Duration <= 0:
		return fmt.Errorf("duration %v is not positive", c.Duration)
	case c.Workers < 1 || c.Goroutines < 1:
		return fmt.Errorf("need at least one worker of one goroutine")
	case c.Lease < 300*time.Millisecond:
		return fmt.Errorf("lease %v is below 300ms", c.Lease)
	case len(c.Prims) == 0:
		return fmt.Errorf("no primitives")
	case c.Names < 1:
		return fmt.Errorf("names %d is below 1", c.Names)
	}
	return nil
}
