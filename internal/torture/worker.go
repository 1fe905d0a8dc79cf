package torture

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/fence"
	"github.com/dlock-go/dlock/internal/torture/history"
)

// WorkerEnv is the environment variable that makes the torture binary run
// as a worker: it holds the worker's spec, as JSON.
const WorkerEnv = "DLOCK_TORTURE_WORKER"

// workerSpec is what the controller tells a worker.
type workerSpec struct {
	Proc       int
	Seed       int64
	Goroutines int
	Lease      time.Duration
	Prims      []string
	Names      int
	Main       string   // the main redis-server, through this worker's proxy
	Redlock    []string // the Redlock masters, through this worker's proxies
	Sentinel   string   // the sentinel's address ("" when no Sentinel workload)
	MasterName string
	Fence      string // the redis-server that holds the fence guard's records (no faults)
	History    string // where to write the history
	BreakLost  bool
}

// IsWorker reports whether this process was started as a worker.
func IsWorker() bool { return os.Getenv(WorkerEnv) != "" }

// WorkerMain runs this process as a worker until its standard input
// closes, and returns the process's exit code.
func WorkerMain() int {
	var spec workerSpec
	if err := json.Unmarshal([]byte(os.Getenv(WorkerEnv)), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "torture worker: bad spec:", err)
		return 2
	}
	if err := runWorker(spec, os.Stdin); err != nil {
		fmt.Fprintln(os.Stderr, "torture worker:", err)
		return 1
	}
	return 0
}

// worker is one worker process: its Clients and its recorder.
type worker struct {
	spec workerSpec
	rec  *history.Recorder

	main, second *dlock.Client // second: the bearer of handed-over holds
	redlock      *dlock.Redlock
	sentinel     *dlock.Client
	guard        *fence.Redis
	rdbs         []io.Closer

	stop context.Context // cancelled when the controller says stop: blocked acquisitions give up
	bg   sync.WaitGroup  // goroutines that outlive a task (see task.release)
}

// quiet is go-redis's logger in a worker: its reconnect and failover lines
// say what the nemesis did, which the history records anyway.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func runWorker(spec workerSpec, stdin io.Reader) error {
	redis.SetLogger(quiet{})
	rec, err := history.NewRecorder(spec.History, spec.Proc)
	if err != nil {
		return err
	}
	defer rec.Close()
	w := &worker{spec: spec, rec: rec}
	// go-redis's own timeouts stay as they are: dlock does not rely on them.
	mainRdb := redis.NewClient(&redis.Options{Addr: spec.Main, MaxRetries: -1})
	w.rdbs = append(w.rdbs, mainRdb)
	opts := []dlock.Option{dlock.WithWatchdogTimeout(spec.Lease), dlock.WithClientName(fmt.Sprintf("worker-%d", spec.Proc))}
	w.main = dlock.New(mainRdb, opts...)
	w.second = dlock.New(mainRdb, opts...)
	if len(spec.Redlock) > 0 {
		var masters []redis.UniversalClient
		for _, a := range spec.Redlock {
			r := redis.NewClient(&redis.Options{Addr: a, MaxRetries: -1, ContextTimeoutEnabled: true})
			w.rdbs = append(w.rdbs, r)
			masters = append(masters, r)
		}
		w.redlock = dlock.NewRedlock(masters, opts...)
	}
	if spec.Sentinel != "" {
		r := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: spec.MasterName, SentinelAddrs: []string{spec.Sentinel}, MaxRetries: -1})
		w.rdbs = append(w.rdbs, r)
		w.sentinel = dlock.New(r, append(opts, dlock.WithSyncReplicas(1, 200*time.Millisecond))...)
	}
	fenceRdb := redis.NewClient(&redis.Options{Addr: spec.Fence})
	w.rdbs = append(w.rdbs, fenceRdb)
	w.guard = fence.NewRedis(fenceRdb)

	stop, cancel := context.WithCancel(context.Background())
	w.stop = stop
	go func() {
		_, _ = io.Copy(io.Discard, stdin) // until the controller closes it
		cancel()
	}()
	var wg sync.WaitGroup
	for g := range spec.Goroutines {
		rng := rand.New(rand.NewPCG(uint64(spec.Seed), uint64(spec.Proc*1000+g)))
		wg.Go(func() { w.loop(g, rng) })
	}
	wg.Wait()
	w.bg.Wait()
	for _, c := range []*dlock.Client{w.main, w.second, w.sentinel} {
		if c != nil {
			_ = c.Close()
		}
	}
	if w.redlock != nil {
		_ = w.redlock.Close()
	}
	for _, r := range w.rdbs {
		_ = r.Close()
	}
	return rec.Flush()
}

// loop runs random tasks until the controller says stop.
func (w *worker) loop(g int, rng *rand.Rand) {
	for seq := 0; w.stop.Err() == nil; seq++ {
		t := &task{w: w, rng: rng, holder: fmt.Sprintf("%d.%d.%d", w.spec.Proc, g, seq)}
		t.prim = w.spec.Prims[rng.IntN(len(w.spec.Prims))]
		t.name = fmt.Sprintf("%s%d", history.Space(t.prim), rng.IntN(w.spec.Names))
		t.run()
		// A short pause between tasks, so that holds are not back to back
		// on every goroutine.
		time.Sleep(time.Duration(rng.IntN(5)) * time.Millisecond)
	}
}

// task is one unit of random work on one primitive and name.
type task struct {
	w      *worker
	rng    *rand.Rand
	prim   string
	name   string
	holder string
}

// invoke records the invocation of f and returns its ID.
func (t *task) invoke(f string, e history.Event) int64 {
	e.ID = t.w.rec.NextID()
	e.Kind, e.Prim, e.F = history.Invoke, t.prim, f
	if e.Name == "" && e.Names == nil {
		e.Name = t.name
	}
	if e.Holder == "" {
		e.Holder = t.holder
	}
	t.w.rec.Record(e)
	return e.ID
}

// complete records the completion of the operation id (of f) with the
// outcome err implies: OK for nil, else Fail or Info (see outcome).
func (t *task) complete(id int64, f string, err error, e history.Event) {
	e.ID, e.Prim, e.F = id, t.prim, f
	if e.Name == "" && e.Names == nil {
		e.Name = t.name
	}
	if e.Holder == "" {
		e.Holder = t.holder
	}
	e.Kind = outcome(err)
	if err != nil {
		e.Err = err.Error()
	}
	t.w.rec.Record(e)
}

// fail records a completion that took no effect.
func (t *task) fail(id int64, f string, e history.Event) {
	e.ID, e.Kind, e.Prim, e.F = id, history.Fail, t.prim, f
	if e.Name == "" && e.Names == nil {
		e.Name = t.name
	}
	if e.Holder == "" {
		e.Holder = t.holder
	}
	t.w.rec.Record(e)
}

// outcome is what an error says about an operation's effect: none (nil
// means it took effect: OK), certainly none (Fail: dlock's own refusals,
// and an ended ctx before anything was granted), or unknown (Info: Redis or
// the network failed).
func outcome(err error) history.Kind {
	switch {
	case err == nil:
		return history.OK
	case errors.Is(err, dlock.ErrNotObtained), errors.Is(err, dlock.ErrNotHeld), errors.Is(err, dlock.ErrLost),
		errors.Is(err, dlock.ErrNoLeader), errors.Is(err, dlock.ErrUpgrade), errors.Is(err, dlock.ErrClosed),
		errors.Is(err, fence.ErrStale):
		return history.Fail
	}
	return history.Info
}

// point records an instant event.
func (t *task) point(f string, e history.Event) {
	e.ID = t.w.rec.NextID()
	e.Kind, e.F = history.Point, f
	if e.Prim == "" {
		e.Prim = t.prim
	}
	if e.Name == "" && e.Names == nil {
		e.Name = t.name
	}
	if e.Holder == "" {
		e.Holder = t.holder
	}
	t.w.rec.Record(e)
}

// hold is a hold as a task sees it: whether it was told it is lost.
type hold struct {
	lost <-chan struct{}
	done chan struct{}
	wg   sync.WaitGroup
	t    *task
}

// watch records the Lost signal of a hold (read: an RW read hold) as soon
// as it fires, until the hold ends.
func (t *task) watch(lost <-chan struct{}, holder string, read bool) *hold {
	h := &hold{lost: lost, done: make(chan struct{}), t: t}
	if lost == nil || t.w.spec.BreakLost {
		return h
	}
	h.wg.Go(func() {
		select {
		case <-lost:
			t.point(history.Lost, history.Event{Holder: holder, Read: read})
		case <-h.done:
		}
	})
	return h
}

// isLost reports whether the holder was told its hold is lost. A broken
// worker (BreakLost) is never told: it goes on as if it held, and records
// no Lost, as a client would whose lock library failed to say.
func (h *hold) isLost() bool {
	if h.t.w.spec.BreakLost || h.lost == nil {
		return false
	}
	select {
	case <-h.lost:
		return true
	default:
		return false
	}
}

// end stops watching: the hold's release completed. A Lost that fires
// later is not one of this hold's (Lost does not fire after a release).
func (h *hold) end() {
	close(h.done)
	h.wg.Wait()
}

// acquireCtx bounds a blocking acquisition: a few leases, and the
// controller's stop.
func (t *task) acquireCtx() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(t.w.stop, time.Duration(2+t.rng.IntN(3))*t.w.spec.Lease)
	return ctx, cancel
}

// opCtx bounds a call that must complete (a release, a write): long enough
// for any fault the nemesis injects to end.
func opCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 20*time.Second)
}

// holdFor is how long a task keeps a hold: mostly short, now and then past
// a renewal period, rarely past a lease. A deaf worker (BreakLost) holds for
// two to four leases, so that a partition that hits one of its holds leaves
// it holding after the lock moved on: what the checkers must catch.
func (t *task) holdFor() time.Duration {
	lease := t.w.spec.Lease
	if t.w.spec.BreakLost {
		return 2*lease + time.Duration(t.rng.Int64N(int64(2*lease)))
	}
	switch r := t.rng.IntN(100); {
	case r < 80:
		return time.Duration(t.rng.IntN(20)) * time.Millisecond
	case r < 97:
		return time.Duration(t.rng.Int64N(int64(lease / 2)))
	default:
		return lease + time.Duration(t.rng.Int64N(int64(lease)))
	}
}

// work keeps the hold for a while, writing through the fence guard with
// token now and then. Mostly as a careful user does, no write once told the
// hold is lost; but a third of the holds told of their loss write once
// more, as a holder does whose check came before a pause: that write is
// the fence guard's to refuse. resource names the guarded resource.
func (t *task) work(h *hold, resource string, token uint64) {
	d := t.holdFor()
	end := time.Now().Add(d)
	for i := 0; ; i++ {
		if h.isLost() {
			if token != 0 && t.rng.IntN(3) == 0 {
				t.write(resource, token) // stale: the guard must refuse it if a newer holder wrote
			}
			return
		}
		if token != 0 && (i == 0 || t.rng.IntN(3) == 0) {
			t.write(resource, token)
		}
		left := time.Until(end)
		if left <= 0 {
			return
		}
		step := min(left, 50*time.Millisecond)
		time.Sleep(step)
	}
}

// write is one fenced write with token to the resource, recorded.
func (t *task) write(resource string, token uint64) {
	id := t.invoke(history.Write, history.Event{Name: resource, Tok: token})
	ctx, cancel := opCtx()
	defer cancel()
	err := t.w.guard.Set(ctx, "res:"+history.Space(t.prim)+":"+resource, token, t.holder, 0)
	t.complete(id, history.Write, err, history.Event{Name: resource, Tok: token})
}
