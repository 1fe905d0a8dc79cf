package dlock

import (
	"context"
	"errors"
	"github.com/dlock-go/dlock/internal/telemetry"
	"github.com/dlock-go/dlock/internal/wire"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// lease is what the watchdog keeps: the keys the server expires, what
// internal/scripts/renew.lua checks to prove the lease is still ours, and until when
// the server is known to keep it. It is embedded in a hold or a mark, which
// the watchdog tells when the lease ends.
type lease struct {
	key   string
	extra []string // companion keys, for wire.SpecMemberWith and wire.SpecMemberWith2
	spec  wire.Spec
	arg   string        // spec as renew.lua reads it
	ttl   time.Duration // the lease the server applies, and renewals apply; a third of it between renewals
	renew bool          // renewed by the watchdog (no WithLease); guarded by the watchdog's mutex once added
	// grantTTL, when set, is the lease the grant runs on until the first
	// renewal, when it differs from ttl (a hold handed over on a waiter's
	// mark). Guarded by the watchdog's mutex once added.
	grantTTL time.Duration
	of       leaseOwner
	start    time.Time // when the request that granted it was sent

	// Guarded by the watchdog's mutex; times on the watchdog's clock.
	sent      int64 // send time of the request that last granted or renewed it
	deadline  int64 // after this the server may have let it go: see leaseDeadline
	idx       int   // index in the deadline heap; -1 when out of it
	releasing bool  // a release is in flight: a missing key is expected
	renewing  int   // renewals of it queued or in flight
	next      int64 // the tick of the renewal schedule it is due at; entries for other ticks are stale
	state     leaseState
}

func newLease(key string, spec wire.Spec, ttl time.Duration, renew bool, sent time.Time) lease {
	return lease{key: key, spec: spec, arg: spec.String(), ttl: ttl, renew: renew, start: sent, idx: -1}
}

// granted is the lease the last grant or renewal runs on.
func (l *lease) granted() time.Duration {
	if l.grantTTL > 0 {
		return l.grantTTL
	}
	return l.ttl
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
	report(w *watchdog, state leaseState, cause error)
}

// errReleased is the cause of a hold context's cancellation after Unlock.
var errReleased = errors.New("dlock: released")

// hold is this Client's record of one hold: a lease, and how to tell the
// holder when it ends.
type hold struct {
	lease
	name     string // the lock's name, for logs and errors
	kind     string // the primitive, for telemetry
	origin   trace.SpanContext
	acquired time.Time

	count  int64       // counted holds the server records; guarded by the owner's gate
	token  uint64      // the fencing token
	cohort cohortState // a Mutex WithCohort: its local handoffs (cohort.go)

	// Guarded by the watchdog's mutex. lost and ctx are made on first use,
	// since most holds never need them.
	cause  error // why the hold ended, once it has
	lost   chan struct{}
	ctx    context.Context // cancelled when the hold ends, however it ends
	cancel context.CancelCauseFunc
	// onLost runs when the hold is lost, at the moment Lost closes, under
	// the watchdog's mutex: it must only close channels or cancel contexts.
	onLost []func(cause error)
}

// newHold records a hold that the server granted on a request sent at sent.
// Its deadline counts from the send, not the reply, since the server may
// have started the lease any time after it (see leaseDeadline). The span in ctx, if any, is the
// one a lost-hold span links back to.
func newHold(ctx context.Context, h *handle, key string, spec wire.Spec, ttl time.Duration, renew bool, sent time.Time) *hold {
	l := &hold{
		lease:    newLease(key, spec, ttl, renew, sent),
		name:     h.name,
		kind:     h.kind,
		origin:   trace.SpanContextFromContext(ctx),
		acquired: time.Now(),
	}
	l.of = l
	return l
}

func (l *hold) ended(state leaseState, cause error) {
	l.state, l.cause = state, cause
	if state == leaseLost {
		// Before Lost closes: whoever Lost wakes finds them done.
		for _, f := range l.onLost {
			f(cause)
		}
		if l.lost != nil {
			close(l.lost)
		}
	}
	l.onLost = nil
	if l.cancel != nil {
		l.cancel(cause)
	}
}

func (l *hold) report(w *watchdog, state leaseState, cause error) {
	switch {
	case state == leaseReleased:
		w.tel.HoldEnded(l.kind, l.name, l.acquired, telemetry.ResultReleased)
	case errors.Is(cause, ErrClosed):
		// A shutdown is not a loss: the holder is told, nothing is counted.
		w.tel.HoldEnded(l.kind, l.name, l.acquired, telemetry.ResultClosed)
	default:
		w.tel.HoldEnded(l.kind, l.name, l.acquired, telemetry.ResultLost)
		w.tel.HoldLost(l.kind, l.name, l.origin, cause)
		w.log.Warn("dlock: hold lost", "name", l.name, "key", l.key, "holder", l.spec.ID, "client", wire.ClientNameOf(l.spec.ID), "cause", cause.Error())
	}
}

// holdContext derives a context from parent that is cancelled when l ends,
// with l's cause (ErrLost when lost). A nil l gives a context that is already
// cancelled with cause ErrNotHeld.
func (w *watchdog) holdContext(parent context.Context, l *hold) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	if l == nil {
		cancel(ErrNotHeld)
		return ctx, func() {}
	}
	w.mu.Lock()
	if l.ctx == nil {
		l.ctx, l.cancel = context.WithCancelCause(context.Background())
		if l.state != leaseHeld {
			l.cancel(l.cause)
		}
	}
	hctx := l.ctx
	w.mu.Unlock()
	stop := context.AfterFunc(hctx, func() { cancel(context.Cause(hctx)) })
	return ctx, func() {
		stop()
		cancel(context.Canceled)
	}
}

// whenLost makes f run when l is lost, at the moment its Lost channel
// closes (see hold.onLost for what f may do); at once if l was lost
// already. It reports false, and f never runs, when l ended otherwise.
func (w *watchdog) whenLost(l *hold, f func(cause error)) bool {
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

// lostOf returns l's lost channel, closed once l is lost, or nil for no
// hold.
func (w *watchdog) lostOf(l *hold) <-chan struct{} {
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

// mark is a waiting caller's place in a queue kept in Redis: a lease the
// watchdog renews while the caller waits, so that a waiter that dies stops
// holding the queue up when its mark runs out.
type mark struct {
	lease
	// gone, when set, runs when the watchdog finds the mark gone or run out:
	// the waiter must look again.
	gone func()
}

func newMark(key string, extra []string, spec wire.Spec, ttl time.Duration, sent time.Time, gone func()) *mark {
	m := &mark{lease: newLease(key, spec, ttl, true, sent), gone: gone}
	m.extra = extra
	m.of = m
	return m
}

func (m *mark) ended(state leaseState, cause error) { m.state = state }

func (m *mark) report(w *watchdog, state leaseState, cause error) {
	if state == leaseLost && m.gone != nil && !errors.Is(cause, ErrClosed) {
		m.gone()
	}
}
