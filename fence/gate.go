package fence

import (
	"sync"
	"sync/atomic"
)

// Gate guards resources inside one Go process: a service that receives
// writes tagged with tokens (in requests or messages) and applies them
// itself. It keeps the highest token admitted for each resource name.
//
// The zero value is an empty Gate, ready to use. A Gate is safe for
// concurrent use and must not be copied after first use.
//
// A Gate remembers every resource it has admitted a token for: one entry
// (some 100 bytes plus the name) per resource, until Forget. Its memory grows
// with the number of distinct resources, not with the number of writes.
//
// A Gate's records live in the process's memory: a restarted process starts
// with none, and admits any token. Guard state that outlives the process with
// the Redis or SQL guard, or keep the records where the state is.
type Gate struct {
	mu      sync.Mutex
	entries map[string]*gateEntry // guarded by mu
}

type gateEntry struct {
	mu       sync.Mutex    // held while a token is checked, and through Do's fn
	admitted atomic.Uint64 // written only with mu held; read without it by Admitted
	dead     bool          // guarded by mu; set by Forget, after which the entry is out of the map
}

// Admit admits token for resource if it is at least the highest token
// admitted for resource so far, and then records it as that highest. It
// returns nil when admitted, a *StaleError (matching ErrStale) when a higher
// token was admitted before, and ErrInvalid for an empty resource or token 0.
//
// Admit waits while a Do for the same resource is running, so a token it
// admits is never admitted in the middle of another writer's fn. Admit
// suits a write that is itself atomic with the admission, or none at all
// (raising the bar before a newer holder starts); otherwise use Do.
func (g *Gate) Admit(resource string, token uint64) error {
	return g.Do(resource, token, nil)
}

// Do runs fn if token is admitted for resource, as Admit admits it, while
// holding the resource: from the admission until fn returns, no other Do or
// Admit for the same resource runs, so no writer, stale or not, interleaves
// with fn, and once fn has started with a token, no lower token is admitted
// for the resource again. Calls for different resources do not wait for one
// another.
//
// Do returns fn's error, or the admission's error without running fn: a
// *StaleError (matching ErrStale), or ErrInvalid for an empty resource or
// token 0. The admission stands even when fn fails or panics: a higher token
// means the older holders' locks have ended, whatever became of the write.
//
// A slow fn holds up every other writer of its resource, and a fn that calls
// Do or Admit on the same Gate for the same resource deadlocks.
func (g *Gate) Do(resource string, token uint64, fn func() error) error {
	if err := checkArgs(resource, token); err != nil {
		return err
	}
	e := g.lock(resource)
	defer e.mu.Unlock()
	if err := admit(resource, token, e.admitted.Load()); err != nil {
		return err
	}
	e.admitted.Store(token)
	if fn == nil {
		return nil
	}
	return fn()
}

// Admitted returns the highest token admitted for resource, or 0 if none
// has been (or the resource was forgotten). It does not wait for a running
// Do.
func (g *Gate) Admitted(resource string) uint64 {
	g.mu.Lock()
	e := g.entries[resource]
	g.mu.Unlock()
	if e == nil {
		return 0
	}
	return e.admitted.Load()
}

// Forget drops what g knows of resource, waiting for a running Do on it to
// return first. After it, any token is admitted for resource again, so call
// it only when no writer can still hold a token for it: the resource was
// deleted for good, or its lock's tokens are no longer in use anywhere.
func (g *Gate) Forget(resource string) {
	for {
		g.mu.Lock()
		e := g.entries[resource]
		g.mu.Unlock()
		if e == nil {
			return
		}
		e.mu.Lock()
		if !e.dead {
			e.dead = true
			g.mu.Lock()
			delete(g.entries, resource)
			g.mu.Unlock()
			e.mu.Unlock()
			return
		}
		e.mu.Unlock() // another Forget dropped it meanwhile; look again
	}
}

// lock returns resource's entry, created if need be, with its mu held.
func (g *Gate) lock(resource string) *gateEntry {
	for {
		g.mu.Lock()
		e := g.entries[resource]
		if e == nil {
			if g.entries == nil {
				g.entries = make(map[string]*gateEntry)
			}
			e = &gateEntry{}
			g.entries[resource] = e
		}
		g.mu.Unlock()
		e.mu.Lock()
		if !e.dead {
			return e
		}
		// Forget took the entry out of the map while we waited for it; a
		// fresh one (or one a concurrent caller made) is in the map now.
		e.mu.Unlock()
	}
}
