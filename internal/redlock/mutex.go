package redlock

// The Redlock Mutex: the engine (engine.Lock) of a Mutex made by a
// Redlock. Its tries are in try.go, waiting in wait.go, its other calls in
// ops.go, and the fan-out to every master in fanout.go.

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/internal/engine"
	"github.com/dlock-go/dlock/internal/lease"
)

// epoch is the origin of Mutex.contested.
var epoch = time.Now()

// contendedFor is how long a sign of contention makes a handle's tries go
// to the gate first (see Mutex.contested).
const contendedFor = time.Second

// contended reports whether the handle saw other callers contend within
// contendedFor.
func (rm *Mutex) contended() bool {
	at := rm.contested.Load()
	return at != 0 && time.Since(epoch)-time.Duration(at) < contendedFor
}

// Mutex is the engine of a Mutex made by a Redlock: what it does instead of
// running the exclusive lock's scripts on one Redis (see Redlock).
type Mutex struct {
	r    *Redlock
	h    *engine.Handle
	slot *engine.Slot
	keys []string // K, F, CH (see internal/scripts/redlock.lua)
	gate int      // the master contended tries ask first (try.go); -1: none
	// contested is when a try of this handle last met other callers
	// (nanoseconds since epoch on the monotonic clock; 0: never): a
	// holder other than the one that refused its previous try refused it
	// (see noteRefusal). For contendedFor after that, its tries ask the
	// gate first (see attempt). A lone waiter does not: it holds in one
	// round trip of every master at once, not two.
	contested atomic.Int64
	// refuser is the holder that refused this handle's last try; nil after
	// a try that held.
	refuser atomic.Pointer[string]
	// live holds the tries kept as holds whose every master has not yet
	// answered, by hold ID: Unlock and ForceUnlock abandon them, so that a
	// grant that reaches a master after the release is given back.
	live sync.Map
}

// abandon stops the try that made hold id from adding masters to it: a
// master that grants it from now on gives the grant back. Unlock and
// ForceUnlock call it before their scripts go out.
func (rm *Mutex) abandon(id string) {
	v, ok := rm.live.LoadAndDelete(id)
	if !ok {
		return
	}
	t := v.(*try)
	t.mu.Lock()
	t.keep = false
	t.mu.Unlock()
}

// NewMutex returns the engine of the Mutex whose handle is h (made by
// r.Core.NewHandle) and whose current hold is in slot.
func (r *Redlock) NewMutex(h *engine.Handle, slot *engine.Slot) *Mutex {
	return &Mutex{r: r, h: h, slot: slot, keys: keysOf(h.Key), gate: gateOf(r.nodes, h.Key)}
}

// HandsOver is false: ReleaseRef and ExtendRef act on one Redis, not on a
// quorum.
func (rm *Mutex) HandsOver() bool { return false }

// Acquire runs Lock (block) or TryLock.
func (rm *Mutex) Acquire(ctx context.Context, op string, block bool) (bool, error) {
	return rm.acquire(ctx, op, block)
}

// Release releases hold l on every master.
func (rm *Mutex) Release(ctx context.Context, l *lease.Hold, op string) error {
	return rm.unlock(ctx, l, op)
}

// Extend runs Extend on every master.
func (rm *Mutex) Extend(ctx context.Context, spanName string, l *lease.Hold, d time.Duration) error {
	return rm.extend(ctx, spanName, l, d)
}

// State reads the lock on every master: the holder a quorum agrees on and
// what its lease has left there.
func (rm *Mutex) State(ctx context.Context, op string) (engine.ExclState, error) {
	holder, left, token, err := rm.state(ctx, op)
	return engine.ExclState{Holder: holder, Left: left, Count: min(int64(len(holder)), 1), Token: token}, err
}

// ForceUnlock frees the lock on every master, whoever holds it.
func (rm *Mutex) ForceUnlock(ctx context.Context, spanName string) (bool, error) {
	return rm.forceUnlock(ctx, spanName)
}

// The test's view of the Mutex.

// Gate returns the index of the gate master, in the order the Redlock was
// given the masters, and that master's name; -1 and "" for a Mutex made
// with bad input.
func (rm *Mutex) Gate() (int, string) {
	if rm.gate < 0 {
		return -1, ""
	}
	return rm.gate, rm.r.nodes[rm.gate].name
}

// Contended reports whether the Mutex's tries go to its gate first.
func (rm *Mutex) Contended() bool { return rm.contended() }

// Contend marks the Mutex as having met other callers just now, as a
// refusal by a second holder would.
func (rm *Mutex) Contend() { rm.contested.Store(int64(time.Since(epoch))) }

// Channel is the release channel of the Mutex.
func (rm *Mutex) Channel() string { return rm.keys[2] }
