package lease

import (
	"container/heap"
	"time"
)

// Pass moves the lease of a hold to a new hold nl taken over locally: nl
// keeps old's holder and lease deadline, and is renewed as old was; old ends
// as released. It fails (false) when old is not held, not renewed, being
// released, has less than MinValidity of its lease left, or the Client
// closed.
func (w *Watchdog) Pass(old, nl *Lease) bool {
	w.mu.Lock()
	now := w.mono(time.Now())
	if w.closed || old.state != leaseHeld || !old.renew || old.releasing ||
		old.deadline-now < int64(MinValidity(old.granted())) {
		w.mu.Unlock()
		return false
	}
	nl.sent, nl.deadline, nl.GrantTTL = old.sent, old.deadline, old.GrantTTL
	nl.Start = w.wall(old.sent)
	heap.Push(&w.deadlines, nl)
	w.schedule(nl, nl.sent+int64(nl.granted()/3))
	w.endLocked(old, leaseReleased, ErrReleased)
	w.unlock()
	kick(w.clockKick)
	if h, ok := nl.of.(*Hold); ok {
		w.tel.HoldStarted(h.Kind, h.Name)
	}
	return true
}
