package dlock

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// lease is this Client's record of one hold: what to renew, until when the
// server is known to keep it, and how to tell the holder when it is lost.
type lease struct {
	name     string // the lock's name, for logs and errors
	kind     string // the primitive, for metrics
	origin   trace.SpanContext
	acquired time.Time
	key      string
	extra    []string      // further keys the renewal needs (kind 'R')
	spec     string        // what renew.lua checks, e.g. "s<token>"; see renew.lua
	renew    bool          // renewed by the watchdog (no WithLease)
	mark     bool          // a waiting mark, not a hold: its end is not logged
	onLost   func()        // a mark's hook when the watchdog finds it gone
	ttl      time.Duration // the lease the server applies

	// Guarded by the watchdog's mutex.
	deadline  time.Time // after this the server may have let the hold expire
	releasing bool      // an unlock is in flight: a missing key is expected
	state     leaseState
	cause     error // why the hold ended, once it has

	count int64 // reentrant holds the server counts; guarded by the owner's gate

	// Made on first use (most holds never need them), guarded by the
	// watchdog's mutex.
	lost   chan struct{}   // closed when the hold is lost
	ctx    context.Context // cancelled when the hold ends, however it ends
	cancel context.CancelCauseFunc
}

type leaseState uint8

const (
	leaseHeld leaseState = iota
	leaseLost
	leaseReleased
)

// newLease records a hold that the server granted on a request sent at sent.
// Its deadline counts from the send, not the reply, since the server may
// have started the lease any time after it. The span in ctx, if any, is the
// one a lost-hold span links back to.
func newLease(ctx context.Context, kind, name, key, spec string, renew bool, ttl time.Duration, sent time.Time) *lease {
	return &lease{
		name: name, kind: kind, key: key, spec: spec, renew: renew, ttl: ttl,
		origin:   trace.SpanContextFromContext(ctx),
		acquired: time.Now(),
		deadline: sent.Add(ttl),
	}
}

// ended records how l ended and signals whoever watches it. Called with the
// watchdog's mutex held.
func (l *lease) ended(state leaseState, cause error) {
	l.state, l.cause = state, cause
	if state == leaseLost && l.lost != nil {
		close(l.lost)
	}
	if l.cancel != nil {
		l.cancel(cause)
	}
}

// holdContext derives a context from parent that is cancelled when l ends,
// with l's cause (ErrLost when lost). A nil l gives a context that is already
// cancelled with cause ErrNotHeld.
func (w *watchdog) holdContext(parent context.Context, l *lease) (context.Context, context.CancelFunc) {
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

// lostOf returns l's lost channel, closed once l is lost, or nil for no
// lease.
func (w *watchdog) lostOf(l *lease) <-chan struct{} {
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
