package lease

import (
	"context"
	"sync"
)

// Contexts are the contexts derived from one hold (its hold contexts),
// cancelled together when the hold ends. The zero value is ready to use;
// it is safe for concurrent use, and its lock is a leaf, so End may be
// called under another lock (the watchdog's, a MultiLock's).
type Contexts struct {
	mu    sync.Mutex
	ended bool
	cause error
	live  map[*context.CancelCauseFunc]struct{}
}

// Derive returns a copy of parent that End cancels, with End's cause; one
// already cancelled with that cause after End. Call the CancelFunc when
// done: it cancels the copy and forgets it.
func (cs *Contexts) Derive(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	cs.mu.Lock()
	if cs.ended {
		cause := cs.cause
		cs.mu.Unlock()
		cancel(cause)
		return ctx, func() { cancel(context.Canceled) }
	}
	if cs.live == nil {
		cs.live = map[*context.CancelCauseFunc]struct{}{}
	}
	key := &cancel
	cs.live[key] = struct{}{}
	cs.mu.Unlock()
	return ctx, func() {
		cs.mu.Lock()
		delete(cs.live, key)
		cs.mu.Unlock()
		cancel(context.Canceled)
	}
}

// End cancels every context derived so far, and every one derived from now
// on, with cause; only the first End counts.
func (cs *Contexts) End(cause error) {
	cs.mu.Lock()
	if cs.ended {
		cs.mu.Unlock()
		return
	}
	cs.ended, cs.cause = true, cause
	live := cs.live
	cs.live = nil
	cs.mu.Unlock()
	for cancel := range live {
		(*cancel)(cause)
	}
}
