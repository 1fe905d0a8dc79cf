package dlock

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/dlock-go/dlock/internal/engine"
	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/scripts"
	"github.com/dlock-go/dlock/internal/telemetry"
	"github.com/dlock-go/dlock/internal/wire"
)

// Status is what a primitive looks like at one moment, as one read of
// Redis found it: for operators and tools (the dlock command's status and
// list), not for deciding who may act, which only a lock call does.
type Status struct {
	Name string // the primitive's name, without the key prefix
	// Kind is what the name holds: KindMutex, KindReentrant, KindRWMutex,
	// KindSemaphore, KindLatch or KindElection.
	Kind string
	// Holders are the holds alive now, the one whose lease ends first
	// first: the holder of a lock or election; an RWMutex's writer or its
	// readers; a Semaphore's permits. At most statusHolders are listed.
	Holders []Holder
	Waiting int    // callers queued in Redis for it, alive (while a Mutex cohort runs, also those it served locally, whose places its release drops)
	Token   uint64 // the fencing token of the current or last hold (last permit); 0 when none is known
	Total   int    // a Semaphore's total permits, -1 when never set
	Free    int    // a Semaphore's permits free now (negative after the total was lowered below those in use)
	Count   int64  // a CountDownLatch's count
}

// Held reports whether anyone holds the primitive.
func (s Status) Held() bool { return len(s.Holders) > 0 }

// Holder is one hold as Status sees it.
type Holder struct {
	// ID is the hold's ID in Redis: its Client's ID, a dot, and the
	// holder's own part (see Client.ID).
	ID string
	// Client is the name of the Client that holds it (see
	// WithClientName): by default "host:pid".
	Client string
	Lease  time.Duration // what its lease has left
	// Count is how many times a counted hold (ReentrantMutex, RWMutex) was
	// entered (an RWMutex read hold: 0 for one handed over and not yet
	// claimed); a permit's
	// number of permits; 1 for a Mutex.
	Count int
	Read  bool // an RWMutex read hold
}

// The kinds Status reports.
const (
	KindMutex     = "mutex"
	KindReentrant = "reentrant"
	KindRWMutex   = "rwmutex"
	KindSemaphore = "semaphore"
	KindLatch     = "latch"
	KindElection  = "election"
)

// statusHolders is the most holders a Status lists.
const statusHolders = 1000

// storedKinds maps the kind field scripts store to the kind Status reports.
var storedKinds = map[string]string{
	telemetry.KindMutex: KindMutex, telemetry.KindReentrant: KindReentrant, "rwlock": KindRWMutex,
	"semaphore": KindSemaphore, "latch": KindLatch, telemetry.KindElection: KindElection,
}

// stateSuffixes are the auxiliary keys of every kind, which internal/scripts/state.lua
// takes whatever kind it finds.
var stateSuffixes = []string{":mq", ":mqe", ":rl", ":rc", ":h", ":c", ":q", ":qe"}

// Status reads the primitive called name, whatever its kind, in one round
// trip. A name with no primitive returns an error matching ErrNotFound; a
// key dlock did not write, ErrInvalid.
func (c *Client) Status(ctx context.Context, name string) (Status, error) {
	return c.statusFor(ctx, "status", name)
}

// statusFor is Status for a call of op (its errors name op).
func (c *Client) statusFor(ctx context.Context, op, name string) (Status, error) {
	h := c.core.NewHandle(op, name, 0, 0, nil)
	st, err := readStatus(ctx, h, op, "")
	if err == nil && st.Kind == "" {
		err = errs.Op(op, name, "", ErrNotFound)
	}
	return st, err
}

// readStatus reads h's primitive with internal/scripts/state.lua, for a call
// of op (its errors name op), expecting the stored kind want ("" for any). A
// free lock of the expected kind whose key is gone reads as the expected
// kind with no holders.
func readStatus(ctx context.Context, h *engine.Handle, op, want string) (Status, error) {
	if err := h.Usable(ctx); err != nil {
		return Status{}, err
	}
	keys := make([]string, 0, 1+len(stateSuffixes))
	keys = append(keys, h.Key)
	for _, s := range stateSuffixes {
		keys = append(keys, h.Key+s)
	}
	res, err := h.C.Script(ctx, scripts.State, keys, want, statusHolders).Slice()
	if err != nil {
		return Status{}, h.Fail(op, err)
	}
	st, err := decodeStatus(h.Name, res)
	if err != nil {
		return Status{}, h.Fail(op, err)
	}
	if st.Kind == "" && want != "" {
		st.Kind = storedKinds[want]
		st.Total = -1
	}
	return st, nil
}

func decodeStatus(name string, res []any) (Status, error) {
	st := Status{Name: name}
	if len(res) != 7 {
		return st, fmt.Errorf("unexpected reply %v", res)
	}
	token, _ := res[1].(string)
	st.Token, _ = strconv.ParseUint(token, 10, 64) // a released lock's too
	stored, _ := res[0].(string)
	if stored == "" {
		return st, nil
	}
	st.Kind = storedKinds[stored]
	if st.Kind == "" {
		st.Kind = stored // a kind of a later dlock version
	}
	waiting, _ := res[2].(int64)
	st.Waiting = int(waiting)
	flat, _ := res[3].([]any)
	for i := 0; i+3 < len(flat); i += 4 {
		id, _ := flat[i].(string)
		left, _ := flat[i+1].(int64)
		count, _ := flat[i+2].(int64)
		read, _ := flat[i+3].(int64)
		st.Holders = append(st.Holders, Holder{
			ID: id, Client: wire.ClientNameOf(id), Lease: time.Duration(left) * time.Millisecond,
			Count: int(count), Read: read == 1,
		})
	}
	sort.SliceStable(st.Holders, func(i, j int) bool { return st.Holders[i].Lease < st.Holders[j].Lease })
	total, _ := res[4].(int64)
	free, _ := res[5].(int64)
	st.Count, _ = res[6].(int64)
	st.Total, st.Free = int(total), int(free)
	if st.Kind == KindMutex {
		for i := range st.Holders {
			st.Holders[i].Count = 1
		}
	}
	return st, nil
}

// Status reads the lock in one round trip: its holder, with what its lease
// has left, how many wait, and its latest fencing token.
func (m *Mutex) Status(ctx context.Context) (Status, error) {
	if _, oneRedis := m.lk.(*engine.Mutex); oneRedis {
		return readStatus(ctx, m.h, "status", m.h.Kind)
	}
	// Another engine (a Redlock: what a quorum of its masters says), from
	// what its State reads.
	x, err := m.lk.State(ctx, "status")
	if err != nil {
		return Status{}, err
	}
	st := Status{Name: m.h.Name, Kind: KindMutex, Token: x.Token, Total: -1, Waiting: int(x.Waiting)}
	if x.Holder != "" {
		st.Holders = []Holder{{ID: x.Holder, Client: wire.ClientNameOf(x.Holder), Lease: x.Left, Count: 1}}
	}
	return st, nil
}

// Status reads the lock in one round trip (see Mutex.Status); the holder's
// Count is its hold count.
func (r *ReentrantMutex) Status(ctx context.Context) (Status, error) {
	return readStatus(ctx, r.h, "status", r.h.Kind)
}

// Status reads the lock in one round trip: the writer, or the readers
// (Holder.Read), and how many wait.
func (rw *RWMutex) Status(ctx context.Context) (Status, error) {
	return readStatus(ctx, rw.h, "status", "rwlock")
}

// Status reads the semaphore in one round trip: its total, the permits
// free, the live permits and how many wait.
func (s *Semaphore) Status(ctx context.Context) (Status, error) {
	return readStatus(ctx, s.h, "status", "semaphore")
}

// Status reads the latch in one round trip: its count.
func (l *CountDownLatch) Status(ctx context.Context) (Status, error) {
	return readStatus(ctx, l.h, "status", "latch")
}
