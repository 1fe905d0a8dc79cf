package lease

import (
	"container/heap"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/telemetry"
	"github.com/dlock-go/dlock/internal/wire"
)

// The watchdog keeps a Client's leases (holds and waiting marks) and tells
// holders, on time, when one is lost. It runs three goroutines:
//
//   - the clock ends every lease whose deadline passes, and does nothing
//     else: no I/O, no telemetry, no log handler stands between a deadline
//     and the holder's Lost channel and hold context;
//   - the renewer sends renewals on a fixed-rate schedule: each renewable
//     lease is renewed once a period (a third of its lease: the watchdog
//     timeout for holds, markLease for waiting marks; a little less when
//     round trips are long, see period) after its last renewal went out,
//     whether or not that one's reply is in, in batches of renewBatch keys
//     per script call; renewSenders goroutines send them, earliest deadline
//     first, and none waits for another's reply, so a slow renewal delays
//     no other renewal, of its lease or any other;
//   - the reporter records ends in telemetry and logs, and wakes waiters
//     whose marks were lost.
//
// A lease's deadline is a fact of the monotonic clock: the send time of the
// request that last acquired or renewed it, plus the lease, less the drift
// margin (see Deadline). Whatever is in flight, the clock ends the lease
// then. A renewal request may take as long as the leases it carries have
// left; its reply only ever moves a deadline forward.
//
// Times are kept as nanoseconds since the watchdog started (on the
// monotonic clock), which makes them small and cheap to compare. This file
// holds the watchdog's state and what callers ask of it; the clock and the
// reporter are in clock.go, the renewer in renewer.go, and how renewals
// reach Redis in renewals.go.
type Watchdog struct {
	timeout time.Duration // the lease of renewable holds and marks
	tick    time.Duration // the renewal schedule's resolution; guarded by mu (see fitTick)
	basis   time.Duration // the shortest lease scheduled yet, which tick is fine enough for; guarded by mu
	horizon time.Duration // a round takes no lease due later than this: a quarter of the longest period
	epoch   time.Time
	send    Sender
	cluster bool // batch per hash slot
	tel     *telemetry.Telemetry
	log     *slog.Logger
	outage  *Outage // logs an outage once, not every renewal that meets it

	// CohortLost, when set (before any lease is added), is called when a
	// hold in a cohort (Cohort.End > 0) is lost, after the watchdog's mutex
	// is released: its Client's goroutines waiting for a local handoff of
	// it must then try in Redis. Not on Close, which wakes them itself. It
	// may run on the goroutine that reported the loss (Lose, and the other
	// calls that end a lease), whatever locks that goroutine holds: it must
	// take none of them (the engine hands its work to a goroutine of its
	// own).
	CohortLost func(l *Hold)

	mu        sync.Mutex
	deadlines leaseHeap          // every lease, earliest deadline first
	due       map[int64][]*Lease // renewable leases by the tick of their next renewal
	closed    bool               // no lease may be added: nothing would renew or report it
	ended     []ending           // ends to report once mu is released

	clockKick, renewKick chan struct{}
	reports              reportQueue
	stop                 chan struct{}
	loops                sync.WaitGroup // the clock and the renewer
	reporterDone         chan struct{}
	chunks               chunkHeap  // renewal pipelines waiting for a sender; guarded by mu
	work                 *sync.Cond // on mu: a chunk was queued, or stopping
	stopping             bool       // guarded by mu: senders exit
	senders              sync.WaitGroup
	stopCtx              context.Context // cancelled by close: renewals in flight give up
	cancelStop           context.CancelFunc

	settled chan struct{} // guarded by mu: made by an Extend waiting for a renewal in flight, closed when renewals settle

	sentCalls atomic.Int64 // renewal script calls sent
	rtt       atomic.Int64 // renewal requests' round trip, ns (see sampleRTT)
}

// ending is an end of a lease to report once the watchdog's mutex is
// released.
type ending struct {
	l     *Lease
	state leaseState
	cause error
}

// MarkLease is the lease of a waiting caller's place in a queue for holds
// of a lease of timeout: a third of it, renewed three times as often.
func MarkLease(timeout time.Duration) time.Duration {
	return time.Duration(wire.Millis(timeout/3)) * time.Millisecond
}

// Deadline is when a lease of ttl, asked for or renewed by a request
// sent at sent, may have run out on the server: sent + ttl, less a margin of
// 1% of ttl for drift between the client's and the server's clocks, and
// 2 ms for the server's millisecond rounding of expiry times.
func Deadline(sent time.Time, ttl time.Duration) time.Time {
	return sent.Add(ttl - DriftMargin(ttl))
}

func DriftMargin(ttl time.Duration) time.Duration { return ttl/100 + 2*time.Millisecond }

// MinValidity is the least a grant must have left of its lease to be
// returned as a hold: one renewal period, a third of the lease. A grant
// that arrives later than that (a cold connection over a slow network, a
// stalled server) is given back: its holder could barely use it, and its
// first renewal would already be late.
func MinValidity(ttl time.Duration) time.Duration { return ttl / 3 }

func NewWatchdog(timeout time.Duration, send Sender, cluster bool, tel *telemetry.Telemetry, outage *Outage) *Watchdog {
	log := outage.Log
	w := &Watchdog{
		timeout:      timeout,
		tick:         max(MarkLease(timeout)/12, time.Millisecond),
		basis:        MarkLease(timeout),
		horizon:      timeout / 12,
		epoch:        time.Now(),
		send:         send,
		cluster:      cluster,
		tel:          tel,
		log:          log,
		outage:       outage,
		due:          make(map[int64][]*Lease),
		clockKick:    make(chan struct{}, 1),
		renewKick:    make(chan struct{}, 1),
		stop:         make(chan struct{}),
		reporterDone: make(chan struct{}),
	}
	w.reports.init()
	w.stopCtx, w.cancelStop = context.WithCancel(context.Background())
	w.work = sync.NewCond(&w.mu)
	w.senders.Add(renewSenders)
	for range renewSenders {
		go w.runSender()
	}
	w.loops.Add(2)
	go w.runClock()
	go w.runRenewer()
	go w.reports.run(w, w.reporterDone)
	return w
}

// mono returns t on the watchdog's clock.
func (w *Watchdog) mono(t time.Time) int64 { return int64(t.Sub(w.epoch)) }

// wall returns the watchdog's time m as a time.Time.
func (w *Watchdog) wall(m int64) time.Time { return w.epoch.Add(time.Duration(m)) }

// tickOf is the tick of the renewal schedule at or before m.
func (w *Watchdog) tickOf(m int64) int64 { return m / int64(w.tick) }

// Add starts keeping a lease whose deadline is set. It returns false after
// close: the caller must give the hold back.
func (w *Watchdog) Add(l *Lease) bool {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return false
	}
	l.sent = w.mono(l.Start)
	l.deadline = w.mono(Deadline(l.Start, l.granted()))
	first := w.deadlines.Len() == 0 || l.deadline < w.deadlines[0].deadline
	heap.Push(&w.deadlines, l)
	if l.renew {
		w.schedule(l, l.sent+int64(l.granted()/3))
	}
	w.mu.Unlock()
	if h, ok := l.of.(*Hold); ok {
		w.tel.HoldStarted(h.Kind, h.Name)
	}
	if first {
		kick(w.clockKick)
	}
	return true
}

func kick(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// BeginRelease marks l as being released, so that a renewal racing the
// release script does not report the hold lost. Its deadline still holds:
// see expire.
func (w *Watchdog) BeginRelease(l *Lease) {
	w.mu.Lock()
	l.releasing = true
	w.mu.Unlock()
}

// AbortRelease undoes BeginRelease. When the release failed, the lease is no
// longer renewed: it ends at its deadline at the latest, since a caller that
// meant to give it up must not keep it alive by accident. A lease that is
// still held (a counted hold with holds left) goes on as before. After close,
// nothing keeps the lease any more: it ends as Close ends every hold.
func (w *Watchdog) AbortRelease(l *Lease, failed bool) {
	w.mu.Lock()
	defer w.unlock()
	l.releasing = false
	switch {
	case w.closed:
		w.endLocked(l, leaseLost, errClosedLost)
	case l.state != leaseHeld:
	case w.mono(time.Now()) >= l.deadline:
		w.endLocked(l, leaseLost, w.expiredCause(l))
	default:
		if failed && l.renew {
			l.renew = false
			w.log.Warn("dlock: release failed; the hold is no longer renewed and ends by its lease",
				"key", l.Key, "lease_left", time.Duration(l.deadline-w.mono(time.Now())).String())
		}
		if l.idx < 0 {
			heap.Push(&w.deadlines, l)
		}
	}
}

// Released ends l after a successful release. It returns the cause when l
// had been lost before, so the release can say so, and nil otherwise.
//
// proven says that the release found l's holder ID on the server, an ID
// unique to the acquisition that took l (a Mutex's hold, a permit): l was
// then held without a break until the release, even if its deadline passed
// while the release was in flight and l was reported lost for it. The
// release then returns nil: what the server did is known, and nobody held
// in between. (A counted hold's owner ID may be shared, so its release
// proves nothing of the kind.)
func (w *Watchdog) Released(l *Lease, proven bool) (lostCause error) {
	w.mu.Lock()
	defer w.unlock()
	l.releasing = false
	if l.state == leaseLost && !proven {
		if h, ok := l.of.(*Hold); ok {
			return h.cause
		}
		return errs.ErrLost
	}
	w.endLocked(l, leaseReleased, ErrReleased)
	return nil
}

// Dropped forgets l without reporting a loss, when the caller no longer
// needs it (a mark whose waiter stopped waiting).
func (w *Watchdog) Dropped(l *Lease) {
	w.mu.Lock()
	defer w.unlock()
	w.endLocked(l, leaseReleased, ErrReleased)
}

// IsHeld reports whether l is still held as far as this Client knows.
func (w *Watchdog) IsHeld(l *Lease) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return l.state == leaseHeld
}

// LostCause returns why l was lost, or nil while it is held or after a
// normal release.
func (w *Watchdog) LostCause(l *Hold) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if l.state == leaseLost {
		return l.cause
	}
	return nil
}

// LastSent returns the send time of the request that last granted or
// renewed l.
func (w *Watchdog) LastSent(l *Lease) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.wall(l.sent)
}

// Lose reports l lost with the given cause, which wraps ErrLost. It is a
// no-op for a lease that already ended.
func (w *Watchdog) Lose(l *Lease, cause error) {
	w.mu.Lock()
	w.endLocked(l, leaseLost, cause)
	w.unlock()
}

// errClosedLost is the cause of the end of every hold still open when the
// Client closes: lost to its holder, but neither counted nor logged as a
// loss, since a shutdown is not one.
var errClosedLost = fmt.Errorf("%w: %w", errs.ErrLost, errs.ErrClosed)

// endLocked ends l, which its owner learns at once; the report (telemetry,
// logs, a waiter's wake-up) follows when the caller releases mu, so that
// exporters and log handlers never run under the watchdog's lock. A lease
// still in a renewal bucket is skipped when its tick comes.
func (w *Watchdog) endLocked(l *Lease, state leaseState, cause error) {
	if l.state != leaseHeld {
		return
	}
	if l.idx >= 0 {
		heap.Remove(&w.deadlines, l.idx)
	}
	l.of.ended(state, cause)
	w.ended = append(w.ended, ending{l, state, cause})
}

// unlock releases mu and reports the ends recorded meanwhile, on the
// calling goroutine (a caller's Unlock, say).
func (w *Watchdog) unlock() {
	q := w.ended
	w.ended = nil
	w.mu.Unlock()
	for _, e := range q {
		e.l.of.report(w, e.state, e.cause)
	}
}

// unlockAsync releases mu and leaves the reports to the reporter goroutine,
// so that the clock and the renewer never wait for an exporter or a log
// handler.
func (w *Watchdog) unlockAsync() {
	q := w.ended
	w.ended = nil
	w.mu.Unlock()
	w.reports.push(q)
}

// Close stops the watchdog and waits for its goroutines and for renewals in
// flight (cancelled, they end with their requests), then reports every
// remaining lease ended with a cause matching both ErrLost and ErrClosed,
// since nothing keeps it any more. Holds being released right now are left
// to their release.
func (w *Watchdog) Close() {
	close(w.stop)
	w.loops.Wait()
	w.cancelStop()
	w.mu.Lock()
	w.stopping = true
	w.work.Broadcast()
	w.mu.Unlock()
	w.senders.Wait()
	w.mu.Lock()
	w.closed = true
	for _, l := range append([]*Lease(nil), w.deadlines...) {
		if !l.releasing {
			w.endLocked(l, leaseLost, errClosedLost)
		}
	}
	w.unlockAsync()
	w.reports.close()
	<-w.reporterDone
}
