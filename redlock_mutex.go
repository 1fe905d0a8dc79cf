package dlock

// The Redlock Mutex: the state a Mutex made by a Redlock carries. Its tries
// are in redlock_try.go, waiting in redlock_wait.go, its other calls in
// redlock_ops.go, and the fan-out to every master in redlock_fanout.go.

import "sync"

// rlMutex is what a Mutex made by a Redlock does instead of running the
// exclusive lock's scripts on one Redis: see Redlock.
type rlMutex struct {
	r    *Redlock
	m    *Mutex
	keys []string // K, F, CH (see scripts/redlock.lua)
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
