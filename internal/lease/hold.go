package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/telemetry"
	"github.com/dlock-go/dlock/internal/wire"
)

// Lease is what the watchdog keeps: the keys the server expires, what
// internal/scripts/renew.lua checks to prove the lease is still ours, and until when
// the server is known to keep it. It is embedded in a hold or a mark, which
// the watchdog tells when the lease ends.
type Lease struct {
	Key   string
	Extra []string // companion keys, for wire.SpecMemberWith and wire.SpecMemberWith2
	Spec  wire.Spec
	Arg   string        // Spec as renew.lua reads it
	TTL   time.Duration // the lease the server applies, and renewals apply; a third of it between renewals
	renew bool          // renewed by the watchdog (no WithLease); guarded by the watchdog's mutex once added
	// GrantTTL, when set, is the lease the grant runs on until the first
	// renewal, when it differs from TTL (a hold handed over on a waiter's
	// mark). Guarded by the watchdog's mutex once added.
	GrantTTL time.Duration
	of       leaseOwner
	Start    time.Time // when the request that granted it was sent

	// Guarded by the watchdog's mutex; times on the watchdog's clock.
	sent      int64 // send time of the request that last granted or renewed it
	deadline  int64 // after this the server may have let it go: see Deadline
	idx       int   // index in the deadline heap; -1 when out of it
	releasing bool  // a release is in flight: a missing key is expected
	renewing  int   // renewals of it queued or in flight
	queued    bool  // a renewal of it waits in the chunk queue, not sent yet
	next      int64 // the tick of the renewal schedule it is due at; entries for other ticks are stale
	state     leaseState
}

func newLease(key string, spec wire.Spec, ttl time.Duration, renew bool, sent time.Time) Lease {
	return Lease{Key: key, Spec: spec, Arg: spec.String(), TTL: ttl, renew: renew, Start: sent, idx: -1}
}

// granted is the lease the last grant or renewal runs on.
func (l *Lease) granted() time.Duration {
	if l.GrantTTL > 0 {
		return l.GrantTTL
	}
	return l.TTL
}

type leaseState uint8

const (
	leaseHeld leaseState = iota
	leaseLost
	leaseReleased
)

// leaseOwner is the hold or mark a lease belongs to.
type leaseOwner interface {
	// ended records how the lease ended and signals whoever waits on it.
	// The watchdog calls it with its mutex held: it must not block.
	ended(state leaseState, cause error)
	// report records the end of the lease in telemetry and logs, or acts on
	// it; the watchdog calls it without its mutex.
	report(w *Watchdog, state leaseState, cause error)
}

// ErrReleased is the cause of a hold context's cancellation after Unlock.
var ErrReleased = errors.New("dlock: released")

// Hold is this Client's record of one hold: a lease, and how to tell the
// holder when it ends.
type Hold struct {
	Lease
	Name     string // the lock's name, for logs and errors
	Kind     string // the primitive, for telemetry
	Origin   trace.SpanContext
	Acquired time.Time

	Count  int64       // counted holds the server records; guarded by the owner's gate
	Token  uint64      // the fencing token
	Cohort CohortState // a Mutex WithCohort: its local handoffs (internal/engine/cohort.go)

	// Guarded by the watchdog's mutex. lost is made on first use, since
	// most holds never need it.
	cause error // why the hold ended, once it has
	lost  chan struct{}
	// ctxs are its hold contexts (HoldContext), cancelled when it ends,
	// however it ends.
	ctxs Contexts
	// onLost runs when the hold is lost, at the moment Lost closes, under
	// the watchdog's mutex: it must only close channels or cancel contexts.
	onLost []func(cause error)
}

// NewHold records a hold of the primitive of kind called name that the
// server granted on a request sent at sent: a lease of ttl on key, which
// spec proves still held, renewed by the watchdog when renew. Its deadline
// counts from the send, not the reply, since the server may have started
// the lease any time after it (see Deadline). The span in ctx, if any, is
// the one a lost-hold span links back to.
func NewHold(ctx context.Context, name, kind, key string, spec wire.Spec, ttl time.Duration, renew bool, sent time.Time) *Hold {
	l := &Hold{
		Lease:    newLease(key, spec, ttl, renew, sent),
		Name:     name,
		Kind:     kind,
		Origin:   trace.SpanContextFromContext(ctx),
		Acquired: time.Now(),
	}
	l.of = l
	return l
}

func (l *Hold) ended(state leaseState, cause error) {
	l.state, l.cause = state, cause
	// Hold contexts and onLost before Lost closes: whoever Lost wakes finds
	// them done.
	l.ctxs.End(cause)
	if state == leaseLost {
		for _, f := range l.onLost {
			f(cause)
		}
		if l.lost != nil {
			close(l.lost)
		}
	}
	l.onLost = nil
}

func (l *Hold) report(w *Watchdog, state leaseState, cause error) {
	switch {
	case state == leaseReleased:
		w.tel.HoldEnded(l.Kind, l.Name, l.Acquired, telemetry.ResultReleased)
	case errors.Is(cause, errs.ErrClosed):
		// A shutdown is not a loss: the holder is told, nothing is counted.
		w.tel.HoldEnded(l.Kind, l.Name, l.Acquired, telemetry.ResultClosed)
	default:
		if l.Cohort.End > 0 && w.CohortLost != nil {
			w.CohortLost(l)
		}
		w.tel.HoldEnded(l.Kind, l.Name, l.Acquired, telemetry.ResultLost)
		w.tel.HoldLost(l.Kind, l.Name, l.Origin, cause)
		w.log.Warn("dlock: hold lost", "name", l.Name, "key", l.Key, "holder", l.Spec.ID, "client", wire.ClientNameOf(l.Spec.ID), "cause", cause.Error())
	}
}

// HoldContext derives a context from parent that is cancelled when l ends,
// with l's cause (ErrLost when lost): by the watchdog, on the goroutine
// that ends l, before l's Lost channel closes. A nil l gives a context that
// is already cancelled with cause ErrNotHeld.
func (w *Watchdog) HoldContext(parent context.Context, l *Hold) (context.Context, context.CancelFunc) {
	if l == nil {
		ctx, cancel := context.WithCancelCause(parent)
		cancel(errs.ErrNotHeld)
		return ctx, func() {}
	}
	return l.ctxs.Derive(parent)
}

// WhenLost makes f run when l is lost, at the moment its Lost channel
// closes (see hold.onLost for what f may do); at once if l was lost
// already. It reports false, and f never runs, when l ended otherwise.
func (w *Watchdog) WhenLost(l *Hold, f func(cause error)) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch l.state {
	case leaseHeld:
		l.onLost = append(l.onLost, f)
		return true
	case leaseLost:
		f(l.cause)
		return true
	}
	return false
}

// LostOf returns l's lost channel, closed once l is lost, or nil for no
// hold.
func (w *Watchdog) LostOf(l *Hold) <-chan struct{} {
	if l == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if l.lost == nil {
		l.lost = make(chan struct{})
		if l.state == leaseLost {
			close(l.lost)
		}
	}
	return l.lost
}

// Mark is a waiting caller's place in a queue kept in Redis: a lease the
// watchdog renews while the caller waits, so that a waiter that dies stops
// holding the queue up when its mark runs out.
type Mark struct {
	Lease
	// gone, when set, runs when the watchdog finds the mark gone or run out:
	// the waiter must look again.
	gone func()
}

func NewMark(key string, extra []string, spec wire.Spec, ttl time.Duration, sent time.Time, gone func()) *Mark {
	m := &Mark{Lease: newLease(key, spec, ttl, true, sent), gone: gone}
	m.Extra = extra
	m.of = m
	return m
}

func (m *Mark) ended(state leaseState, cause error) { m.state = state }

func (m *Mark) report(w *Watchdog, state leaseState, cause error) {
	if state == leaseLost && m.gone != nil && !errors.Is(cause, errs.ErrClosed) {
		m.gone()
	}
}

// CohortState is what a hold of a cohorting Mutex carries from one local
// handoff to the next.
type CohortState struct {
	Grant  uint64    // the Redis grant's token
	End    uint64    // the last token the Redis grant reserved; 0: no cohort
	N      int       // local handoffs since the Redis grant
	Since  time.Time // when the Redis grant was kept
	Served []string  // queue places of the waiters served locally
	// Quiet, for a grant that found nobody queued since the lock was last
	// free, is when its try was sent; zero otherwise.
	Quiet time.Time
}

// Hold returns the hold l is the lease of, or nil for a waiting mark's.
func (l *Lease) Hold() *Hold {
	h, _ := l.of.(*Hold)
	return h
}

// The bounds of a lease or watchdog timeout (dlock.MinLease and
// dlock.MaxLease, which document them).
const (
	Min = 10 * time.Millisecond
	Max = 365 * 24 * time.Hour
)

// OutOfBounds says why d, the what of a call, is not a lease dlock
// accepts, or "".
func OutOfBounds(what string, d time.Duration) string {
	switch {
	case d < Min:
		return fmt.Sprintf("%s %v is below the minimum lease, %v (dlock.MinLease)", what, d, Min)
	case d > Max:
		return fmt.Sprintf("%s %v is above the maximum lease, %v (dlock.MaxLease)", what, d, Max)
	}
	return ""
}
