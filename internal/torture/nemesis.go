package torture

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/dlock-go/dlock/internal/torture/history"
)

// nemesis injects one fault at a time, on a random schedule drawn from the
// run's seed, and records each fault's start and end. Every fault it
// starts it also ends, before it starts the next; healAll ends whatever is
// still on when the run stops it.
type nemesis struct {
	cfg     Config
	rng     *rand.Rand
	rec     *history.Recorder
	srv     *servers
	workers []*os.Process
	faults  []string // the faults this run can inject (those whose targets exist)
	errs    []error  // faults that failed to start or end
	// restarted runs after the main server came back empty, as a service
	// sets up its primitives again at start (the semaphores' totals).
	restarted func() error
}

func newNemesis(cfg Config, rec *history.Recorder, srv *servers, workers []*os.Process) *nemesis {
	n := &nemesis{cfg: cfg, rng: rand.New(rand.NewPCG(uint64(cfg.Seed), 0x6e656d)), rec: rec, srv: srv, workers: workers}
	for _, f := range cfg.Faults {
		switch {
		case f == FaultFailover && srv.sent == nil:
		case (f == FaultMasterStop || f == FaultMasterKill) && len(srv.masters) == 0:
		default:
			n.faults = append(n.faults, f)
		}
	}
	return n
}

// between returns a random duration in [lo, hi] leases.
func (n *nemesis) between(lo, hi float64) time.Duration {
	return time.Duration((lo + n.rng.Float64()*(hi-lo)) * float64(n.cfg.Lease))
}

func (n *nemesis) point(f, target string, v int64) {
	n.rec.Record(history.Event{ID: n.rec.NextID(), Kind: history.Point, Prim: history.Nemesis, F: f, Target: target, N: v})
}

// run injects faults until ctx ends.
func (n *nemesis) run(ctx context.Context) {
	if len(n.faults) == 0 {
		<-ctx.Done()
		return
	}
	for {
		if !sleep(ctx, n.between(0.2, 2)) {
			return
		}
		f := n.faults[n.rng.IntN(len(n.faults))]
		if err := n.inject(ctx, f); err != nil {
			n.errs = append(n.errs, fmt.Errorf("%s: %w", f, err))
			n.logf("nemesis: %s: %v", f, err)
		}
	}
}

func (n *nemesis) logf(format string, args ...any) {
	if n.cfg.Logf != nil {
		n.cfg.Logf(format, args...)
	}
}

// sleep waits d or until ctx ends, and reports whether d passed. A fault
// in progress always ends, even when ctx ends: its second half uses
// hold, which does not look at ctx.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// inject starts fault f, keeps it for a random while, and ends it.
func (n *nemesis) inject(ctx context.Context, f string) error {
	lease := n.cfg.Lease
	w := n.rng.IntN(len(n.workers))
	target := strconv.Itoa(w)
	switch f {
	case FaultPause:
		d := n.between(0.3, 3)
		n.logf("nemesis: pause worker %d for %v", w, d)
		n.point(history.Pause, target, 0)
		if err := n.workers[w].Signal(syscall.SIGSTOP); err != nil {
			return err
		}
		time.Sleep(d)
		err := n.workers[w].Signal(syscall.SIGCONT)
		n.point(history.Resume, target, 0)
		return err
	case FaultPartition:
		d := n.between(0.3, 3)
		n.logf("nemesis: partition worker %d for %v", w, d)
		n.point(history.Partition, target, 0)
		for _, p := range n.srv.proxies[w] {
			p.Partition()
		}
		time.Sleep(d)
		for _, p := range n.srv.proxies[w] {
			p.Heal()
		}
		n.point(history.Heal, target, 0)
	case FaultLatency:
		each := n.between(0.02, 0.2) // up to 40% of the lease a round trip
		d := n.between(1, 4)
		n.logf("nemesis: %v each way to worker %d for %v", each, w, d)
		n.point(history.Latency, target, each.Milliseconds())
		for _, p := range n.srv.proxies[w] {
			p.SetLatency(each, each)
		}
		time.Sleep(d)
		for _, p := range n.srv.proxies[w] {
			p.SetLatency(0, 0)
		}
		n.point(history.LatencyEnd, target, 0)
	case FaultReset:
		n.logf("nemesis: reset worker %d's connections", w)
		n.point(history.Reset, target, 0)
		for _, p := range n.srv.proxies[w] {
			p.DropAll()
		}
	case FaultRestart:
		d := time.Duration(100+n.rng.IntN(900)) * time.Millisecond
		n.logf("nemesis: kill the main redis-server, restart it empty after %v", d)
		n.point(history.KillRedis, "main", 0)
		n.srv.main.Stop()
		time.Sleep(d)
		err := n.srv.main.RestartProcess()
		n.point(history.RestartRedis, "main", 0)
		if err == nil && n.restarted != nil {
			err = n.restarted()
		}
		return err
	case FaultFlush:
		n.logf("nemesis: SCRIPT FLUSH")
		n.point(history.ScriptFlush, "main", 0)
		_, err := n.srv.main.Do(context.Background(), "script", "flush")
		return err
	case FaultPubSub:
		n.logf("nemesis: CLIENT KILL TYPE pubsub")
		n.point(history.KillPubSub, "main", 0)
		_, err := n.srv.main.Do(context.Background(), "client", "kill", "type", "pubsub")
		return err
	case FaultFailover:
		n.logf("nemesis: Sentinel failover")
		n.point(history.FailoverStart, "sentinel", 0)
		fctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		err := n.srv.sent.failover(fctx)
		n.point(history.FailoverEnd, "sentinel", 0)
		return err
	case FaultMasterStop:
		m := n.rng.IntN(len(n.srv.masters))
		d := n.between(0.3, 3)
		n.logf("nemesis: pause Redlock master %d for %v", m, d)
		n.point(history.MasterPause, strconv.Itoa(m), 0)
		p := n.srv.masters[m].Process()
		if p == nil {
			return fmt.Errorf("master %d not running", m)
		}
		if err := p.Signal(syscall.SIGSTOP); err != nil {
			return err
		}
		time.Sleep(d)
		err := p.Signal(syscall.SIGCONT)
		n.point(history.MasterResume, strconv.Itoa(m), 0)
		return err
	case FaultMasterKill:
		m := n.rng.IntN(len(n.srv.masters))
		// Redlock's delayed restart: a master that lost its data comes back
		// only after every lease it may have granted has run out.
		d := lease + lease/2 + 500*time.Millisecond
		n.logf("nemesis: kill Redlock master %d, restart it empty after %v", m, d)
		n.point(history.MasterKill, strconv.Itoa(m), 0)
		n.srv.masters[m].Stop()
		time.Sleep(d)
		err := n.srv.masters[m].RestartProcess()
		n.point(history.MasterRestart, strconv.Itoa(m), 0)
		return err
	default:
		return fmt.Errorf("unknown fault %q", f)
	}
	_ = ctx
	return nil
}

// healAll ends every fault a worker may still be under: a worker left
// stopped, a proxy left partitioned or slow. inject always ends its faults,
// so this is a guard, not the normal path.
func (n *nemesis) healAll() {
	for _, p := range n.workers {
		_ = p.Signal(syscall.SIGCONT)
	}
	for _, ps := range n.srv.proxies {
		for _, p := range ps {
			p.Heal()
			p.SetLatency(0, 0)
		}
	}
}
