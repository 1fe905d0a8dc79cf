package lease

import (
	"fmt"
	"sync"
	"time"

	"github.com/dlock-go/dlock/internal/errs"
)

// The watchdog's clock: the goroutine that ends leases at their deadlines,
// the heap that orders them, and the reporter that records their ends. See
// watchdog.go.

// expiredCause is why a lease whose deadline passed is lost.
func (w *Watchdog) expiredCause(l *Lease) error {
	if l.renew {
		return fmt.Errorf("%w: not renewed within the %v lease", errs.ErrLost, l.TTL)
	}
	return fmt.Errorf("%w: the %v lease expired", errs.ErrLost, l.TTL)
}

// runClock ends leases at their deadlines.
func (w *Watchdog) runClock() {
	w.loop(w.clockKick, func() (time.Duration, bool) {
		next := w.expire()
		return next, next > 0
	})
}

// loop runs step, then again whenever kick fires or the time step returned
// has passed (false: no time, only a kick), until the watchdog stops.
func (w *Watchdog) loop(kick chan struct{}, step func() (time.Duration, bool)) {
	defer w.loops.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		if next, ok := step(); ok {
			timer.Reset(next)
		}
		select {
		case <-w.stop:
			return
		case <-timer.C:
		case <-kick:
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// expire ends every lease whose deadline has passed and returns how long
// until the next deadline (0: none). A lease being released ends too: the
// release may never reach Redis (a partition, a stalled server), and the
// server may let the lease go and grant it to someone else from the
// deadline on, so its holder must hear of it then, not when the release's
// reply comes. A release that then succeeds returns the loss (see
// watchdog.released).
func (w *Watchdog) expire() time.Duration {
	w.mu.Lock()
	defer w.unlockAsync()
	now := w.mono(time.Now())
	for w.deadlines.Len() > 0 && w.deadlines[0].deadline <= now {
		l := w.deadlines[0]
		w.endLocked(l, leaseLost, w.expiredCause(l))
	}
	if w.deadlines.Len() == 0 {
		return 0
	}
	return time.Duration(w.deadlines[0].deadline - now)
}

// leaseHeap orders leases by deadline, earliest first. Each lease knows its
// index (idx), -1 when out of the heap.
type leaseHeap []*Lease

func (h leaseHeap) Len() int           { return len(h) }
func (h leaseHeap) Less(i, j int) bool { return h[i].deadline < h[j].deadline }
func (h leaseHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *leaseHeap) Push(x any) {
	l := x.(*Lease)
	l.idx = len(*h)
	*h = append(*h, l)
}
func (h *leaseHeap) Pop() any {
	old := *h
	l := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	l.idx = -1
	return l
}

// reportQueue hands ends from the clock and the renewer to the reporter
// goroutine, which records them.
type reportQueue struct {
	mu     sync.Mutex
	q      []ending
	closed bool
	kick   chan struct{}
}

func (r *reportQueue) init() { r.kick = make(chan struct{}, 1) }

func (r *reportQueue) push(q []ending) {
	if len(q) == 0 {
		return
	}
	r.mu.Lock()
	r.q = append(r.q, q...)
	r.mu.Unlock()
	kick(r.kick)
}

func (r *reportQueue) close() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	kick(r.kick)
}

// run reports ends until the queue is closed and drained.
func (r *reportQueue) run(w *Watchdog, done chan struct{}) {
	defer close(done)
	for range r.kick {
		r.mu.Lock()
		q, closed := r.q, r.closed
		r.q = nil
		r.mu.Unlock()
		for _, e := range q {
			e.l.of.report(w, e.state, e.cause)
		}
		if closed {
			return
		}
	}
}
