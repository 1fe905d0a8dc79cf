package lease

import (
	"container/heap"
	"context"
	"fmt"
	"time"

	"github.com/dlock-go/dlock/internal/errs"
)

type ExtendOutcome uint8

const (
	ExtendApplied ExtendOutcome = iota // the server set the new lease
	ExtendGone                         // the server had no such hold
	ExtendUnknown                      // the request failed: either may be true
)

// BeginExtend stops l's renewals ahead of an Extend and waits until no
// renewal of l is in flight. It returns why l ended, if it has.
func (w *Watchdog) BeginExtend(ctx context.Context, l *Lease) error {
	w.mu.Lock()
	renew := l.renew
	for {
		if l.state != leaseHeld || l.releasing {
			w.mu.Unlock()
			if h, ok := l.of.(*Hold); ok && h.cause != nil && l.state == leaseLost {
				return h.cause
			}
			return errs.ErrNotHeld
		}
		l.renew = false
		if l.renewing == 0 {
			w.mu.Unlock()
			return nil
		}
		if w.settled == nil {
			w.settled = make(chan struct{})
		}
		settled := w.settled
		w.mu.Unlock()
		select {
		case <-settled:
		case <-ctx.Done():
			w.mu.Lock()
			if l.state == leaseHeld && renew && !l.renew {
				l.renew = true
				w.schedule(l, w.mono(time.Now()))
			}
			w.mu.Unlock()
			return ctx.Err()
		}
		w.mu.Lock()
	}
}

// Extended records the outcome of an Extend of l to ttl, sent at sent.
// Applied, l now ends at its new deadline, earlier or later than before;
// gone, it is lost (unless a release of it is in flight); unknown, it ends
// by the earlier of its old and new deadlines.
func (w *Watchdog) Extended(l *Lease, ttl time.Duration, sent time.Time, outcome ExtendOutcome) {
	w.mu.Lock()
	defer w.unlock()
	if l.state != leaseHeld {
		return
	}
	deadline := w.mono(Deadline(sent, ttl))
	switch outcome {
	case ExtendGone:
		if !l.releasing {
			w.endLocked(l, leaseLost, fmt.Errorf("%w: extend found the hold gone", errs.ErrLost))
		}
		return
	case ExtendUnknown:
		deadline = min(deadline, l.deadline)
	}
	l.TTL, l.GrantTTL = ttl, 0
	l.sent, l.deadline = w.mono(sent), deadline
	if deadline <= w.mono(time.Now()) {
		w.endLocked(l, leaseLost, w.expiredCause(l))
		return
	}
	if l.idx >= 0 {
		heap.Fix(&w.deadlines, l.idx)
	}
	kick(w.clockKick)
}
