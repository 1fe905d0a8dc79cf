package dlock

// The Redlock Mutex: the state a Mutex made by a Redlock carries. Its tries
// are in redlock_try.go, waiting in redlock_wait.go, its other calls in
// redlock_ops.go, and the fan-out to every master in redlock_fanout.go.

import (
	"sync"
	"sync/atomic"
	"time"
)

// rlEpoch is the origin of rlMutex.contested.
var rlEpoch = time.Now()

// contendedFor is how long a sign of contention makes a handle's tries go
// to the gate first (see rlMutex.contested).
const contendedFor = time.Second

// contended reports whether the handle saw other callers contend within
// contendedFor.
func (rm *rlMutex) contended() bool {
	at := rm.contested.Load()
	return at != 0 && time.Since(rlEpoch)-time.Duration(at) < contendedFor
}

// rlMutex is what a Mutex made by a Redlock does instead of running the
// exclusive lock's scripts on one Redis: see Redlock.
type rlMutex struct {
	r    *Redlock
	m    *Mutex
	keys []string // K, F, CH (see internal/scripts/redlock.lua)
	gate int      // the master contended tries ask first (redlock_try.go); -1: none
	// contested is when a try of this handle last met other callers
	// (nanoseconds since rlEpoch on the monotonic clock; 0: never): a
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
func (rm *rlMutex) abandon(id string) {
	v, ok := rm.live.LoadAndDelete(id)
	if !ok {
		return
	}
	t := v.(*rlTry)
	t.mu.Lock()
	t.keep = false
	t.mu.Unlock()
}
