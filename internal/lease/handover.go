package lease

import (
	"errors"
	"time"
)

// errHandedOver is the cause of a hold context's cancellation after a hand
// over: the hold goes on, but no longer under this Client.
var errHandedOver = errors.New("dlock: handed over")

// HandOver stops keeping l, whose renewals BeginExtend stopped: the hold
// goes on in Redis under whoever it is handed to, and ends here as
// released, not lost. It reports false, ending l as lost, when l's
// deadline had already passed.
func (w *Watchdog) HandOver(l *Lease) bool {
	w.mu.Lock()
	defer w.unlock()
	if w.mono(time.Now()) >= l.deadline {
		w.endLocked(l, leaseLost, w.expiredCause(l))
		return false
	}
	w.endLocked(l, leaseReleased, errHandedOver)
	return true
}

// SentCalls is how many renewal script calls the watchdog has sent.
func (w *Watchdog) SentCalls() int64 { return w.sentCalls.Load() }
