// Package history is the torture suite's record of what happened: every
// operation a worker process called on a dlock primitive (its invocation and
// its completion), every Lost signal, every fenced write, and every fault the
// nemesis injected, each stamped with one clock that all the processes of a
// run share (CLOCK_MONOTONIC, see Now).
//
// A history is a file of JSON lines, one Event per line, written by each
// process as events happen (see Recorder) and merged by the controller
// (Load). The checkers (package check) read only this format.
package history

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Now returns the time on the clock every process of a run shares: Linux's
// CLOCK_MONOTONIC, in nanoseconds. It is system-wide, does not jump with
// the wall clock, and keeps running while a process is stopped (SIGSTOP),
// so the events of paused and running processes are ordered correctly.
func Now() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(fmt.Sprintf("clock_gettime: %v", err)) // cannot fail on Linux
	}
	return ts.Nano()
}

// Kind says what an Event records.
type Kind string

const (
	// Invoke: an operation was called. Every Invoke is followed by exactly
	// one completion (OK, Fail or Info) with the same Proc and ID, unless
	// the process died.
	Invoke Kind = "invoke"
	// OK: the operation completed and took effect (Lock returned nil,
	// TryLock returned true, a fenced write was admitted...). Results are in
	// the event's fields.
	OK Kind = "ok"
	// Fail: the operation completed and certainly took no effect (TryLock
	// returned false, Lock's ctx ended, a fenced write was refused as stale,
	// Unlock returned ErrNotHeld or ErrLost).
	Fail Kind = "fail"
	// Info: the operation completed with an error after which its effect is
	// unknown (a network failure): it may or may not have taken effect.
	Info Kind = "info"
	// Point: something happened at one instant: a Lost signal, a fault of
	// the nemesis, a setting the checkers need.
	Point Kind = "point"
)

// Primitives (Event.Prim). Several share one lock space: see Space.
const (
	Mutex         = "mutex"          // Mutex, cohorting on (the default)
	MutexNoCohort = "mutex-nocohort" // Mutex WithoutCohort
	MultiLock     = "multilock"      // MultiLock over mutex names (Names)
	HandOver      = "handover"       // Mutex handed to another Client with HandOver, released with ReleaseRef
	Reentrant     = "reentrant"
	RW            = "rw"
	Semaphore     = "semaphore"
	Latch         = "latch"
	Election      = "election"
	Redlock       = "redlock"  // Mutex over the Redlock masters
	Sentinel      = "sentinel" // Mutex on the Sentinel-managed master, WithSyncReplicas
	Nemesis       = "nemesis"  // the controller's faults and settings
)

// Space returns the lock space of a primitive: primitives in one space
// share keys, so a name in it is one lock whichever of them takes it
// (a MultiLock's members are Mutexes of those names).
func Space(prim string) string {
	switch prim {
	case Mutex, MutexNoCohort, MultiLock, HandOver:
		return Mutex
	}
	return prim
}

// Functions (Event.F).
const (
	Lock       = "lock"       // Mutex, Reentrant, RW (write), Election: Campaign; Redlock, Sentinel, MultiLock
	TryLock    = "trylock"    // as Lock, one try
	Unlock     = "unlock"     // release of a Lock (Reentrant: one level); Election: Resign; HandOver: ReleaseRef
	RLock      = "rlock"      // RW read side
	TryRLock   = "tryrlock"   // RW read side, one try
	RUnlock    = "runlock"    // RW read side
	Acquire    = "acquire"    // Semaphore: N permits, holder = permit ID
	TryAcquire = "tryacquire" // Semaphore, one try
	Release    = "release"    // Semaphore permit release
	SetCount   = "setcount"   // Latch TrySetCount(N): OK with B = whether it set
	CountDown  = "countdown"  // Latch
	Await      = "await"      // Latch: OK when it returned because the count was zero
	Delete     = "delete"     // Latch
	Write      = "write"      // a fenced write with Tok under Holder's hold: OK admitted, Fail refused (stale)
	Lost       = "lost"       // Point: Holder's hold signalled Lost (Read: its read hold)
	Handed     = "handed"     // Point: HandOver moved Holder's hold to NewHolder
	// Claimed (Point): the bearer Holder of a handed hold claimed it (its
	// ExtendRef succeeded) and acts on it from here. Until then nobody
	// acts on the hold, and its lease may end at any moment.
	Claimed = "claimed"
)

// Nemesis functions (Prim Nemesis, Kind Point). A fault has a start and an
// end event with the same Target; Start events come first.
const (
	Pause          = "pause"           // Target: worker process index, SIGSTOP
	Resume         = "resume"          // SIGCONT
	Partition      = "partition"       // Target: worker index; every byte between it and Redis held back
	Heal           = "heal"            // partition over
	Latency        = "latency"         // Target: worker index; N ms each way
	LatencyEnd     = "latency-end"     //
	Reset          = "reset"           // Target: worker index; its connections dropped (one instant)
	KillRedis      = "kill-redis"      // the main redis-server killed (-9): its data is lost
	RestartRedis   = "restart-redis"   // it runs again, empty, on the same port
	ScriptFlush    = "script-flush"    // SCRIPT FLUSH on the main redis-server (one instant)
	KillPubSub     = "kill-pubsub"     // CLIENT KILL TYPE pubsub on the main redis-server (one instant)
	FailoverStart  = "failover-start"  // a Sentinel failover was asked for
	FailoverEnd    = "failover-end"    // the replica is master
	MasterPause    = "master-pause"    // Target: Redlock master index, SIGSTOP
	MasterResume   = "master-resume"   //
	MasterKill     = "master-kill"     // Target: Redlock master index, killed (-9)
	MasterRestart  = "master-restart"  // restarted empty, after the longest lease (Redlock's delayed restart)
	Setting        = "setting"         // Name: what (lease, period, total:<sem>), N: its value (ms or count)
	KeyWithoutTTL  = "key-without-ttl" // Name: a key left with no expiry at the end that no primitive promises to keep
	FinalAvailable = "final-available" // Name: a semaphore; N: its available permits after the run, faults healed
	QuietStart     = "quiet-start"     // the nemesis stopped and every fault healed
)

// Event is one line of a history.
type Event struct {
	T    int64  `json:"t"`              // Now() when it happened
	Proc int    `json:"p"`              // worker process index; -1 for the controller
	ID   int64  `json:"id"`             // pairs an Invoke with its completion, unique per Proc
	Kind Kind   `json:"k"`              // see Kind
	Prim string `json:"prim,omitempty"` // see the primitive constants
	F    string `json:"f"`              // see the function constants
	Name string `json:"name,omitempty"` // the primitive's name
	// Names: a MultiLock's member names.
	Names []string `json:"names,omitempty"`
	// Holder identifies the hold an operation takes, releases or writes
	// under: a Mutex hold, a reentrant or RW owner, a permit, a campaign.
	// Unique in a run. For Handed, the hold's new holder is NewHolder.
	Holder    string `json:"holder,omitempty"`
	NewHolder string `json:"newholder,omitempty"`
	// Tok: the fencing token an OK acquisition returned (0 when the
	// primitive issues none: a read hold), or the token a Write carried.
	Tok uint64 `json:"tok,omitempty"`
	// Toks: a MultiLock's tokens, by name.
	Toks map[string]uint64 `json:"toks,omitempty"`
	// N: permits (Acquire, Release), the count (SetCount), a Reentrant
	// hold count after the call, a latency (ms), a setting's value.
	N int64 `json:"n,omitempty"`
	// B: a boolean result (SetCount: whether it set the count).
	B bool `json:"b,omitempty"`
	// Read: a Lost of an RW read hold.
	Read   bool   `json:"read,omitempty"`
	Target string `json:"target,omitempty"` // a nemesis fault's target
	Err    string `json:"err,omitempty"`    // the error of a Fail or Info
}

// Recorder writes one process's events to a file, a line each, as they
// happen. Its methods are safe for concurrent use.
type Recorder struct {
	proc int
	ids  atomic.Int64

	mu  sync.Mutex
	w   *bufio.Writer
	f   *os.File
	err error
}

// NewRecorder returns a Recorder for process proc writing to path.
func NewRecorder(path string, proc int) (*Recorder, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	return &Recorder{proc: proc, f: f, w: bufio.NewWriter(f)}, nil
}

// NextID returns a fresh operation ID.
func (r *Recorder) NextID() int64 { return r.ids.Add(1) }

// Record stamps e with the process (and the time, when e.T is 0) and
// writes it. It returns e as written.
func (r *Recorder) Record(e Event) Event {
	e.Proc = r.proc
	if e.T == 0 {
		e.T = Now()
	}
	line, err := json.Marshal(e)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		_, err = r.w.Write(append(line, '\n'))
	}
	if err != nil && r.err == nil {
		r.err = err
	}
	return e
}

// Flush writes buffered events to the file.
func (r *Recorder) Flush() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.w.Flush(); err != nil && r.err == nil {
		r.err = err
	}
	return r.err
}

// Close flushes and closes the file.
func (r *Recorder) Close() error {
	err := r.Flush()
	if cerr := r.f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Read parses a history file.
func Read(rd io.Reader) ([]Event, error) {
	var out []Event
	sc := bufio.NewScanner(rd)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for line := 1; sc.Scan(); line++ {
		if len(sc.Bytes()) == 0 {
			continue
		}
		var e Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		out = append(out, e)
	}
	return out, sc.Err()
}

// Load reads and merges history files, ordered by time (stable, so one
// process's events keep their order).
func Load(paths ...string) ([]Event, error) {
	var all []Event
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return nil, err
		}
		evs, err := Read(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		all = append(all, evs...)
	}
	Sort(all)
	return all, nil
}

// Sort orders events by time, keeping the order of equal times.
func Sort(evs []Event) {
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].T < evs[j].T })
}

// WriteAll writes events as a history file.
func WriteAll(w io.Writer, evs []Event) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	for _, e := range evs {
		if err := enc.Encode(e); err != nil {
			return err
		}
	}
	return bw.Flush()
}
