package engine

import (
	"context"
	"runtime"
	"time"

	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/lease"
	"github.com/dlock-go/dlock/internal/telemetry"
	"github.com/dlock-go/dlock/internal/wait"
	"github.com/dlock-go/dlock/internal/wire"
)

// Handle is what every primitive's handle shares: its Core, its kind and
// name, its main key and channel, its lease, and the error bad input left,
// which every call then returns. A Handle is not changed once made.
type Handle struct {
	C       *Core
	Kind    string // the dlock.kind attribute (telemetry.KindMutex, ...)
	Name    string
	Key     string        // p{name}; auxiliary keys add a suffix
	Channel string        // where releases are published
	Keys    []string      // every key of the primitive, main key first, then the channel
	Lease   time.Duration // fixed lease; 0: the watchdog renews holds
	Renewed time.Duration // the lease the watchdog renews (WithRenewedLease); 0: the Core's
	Err     error
}

// NewHandle makes the handle of a primitive whose auxiliary keys are its
// main key with the given suffixes. err is bad input the caller found; a
// bad name is found here.
func (c *Core) NewHandle(kind, name string, lease, renewed time.Duration, err error, suffixes ...string) *Handle {
	if err == nil {
		err = wire.CheckName(name)
	}
	key := wire.LockKey(c.Cfg.Prefix, name)
	h := &Handle{C: c, Kind: kind, Name: name, Key: key, Channel: wire.ChannelOf(key), Lease: lease, Renewed: renewed, Err: err}
	c.noteRenewed(renewed)
	h.Keys = append(h.Keys, key)
	for _, s := range suffixes {
		h.Keys = append(h.Keys, key+s)
	}
	h.Keys = append(h.Keys, h.Channel)
	return h
}

// Usable reports the error a call must return before touching Redis: a bad
// Client or handle, a nil ctx, or a closed Client.
func (h *Handle) Usable(ctx context.Context) error {
	switch c := h.C; {
	case c.Err != nil:
		return c.Err
	case h.Err != nil:
		return h.Err
	case ctx == nil:
		return errs.Invalidf("nil context")
	case c.closed.Load():
		return errs.ErrClosed
	}
	return nil
}

// Begin opens the span of a call that is not an acquisition (a release, a
// count-down) and checks that it may proceed. The span is open even when an
// error is returned, so the caller can end it with that error.
func (h *Handle) Begin(ctx context.Context, spanName string) (context.Context, telemetry.Span, error) {
	if ctx == nil {
		_, sp := h.C.Tel.Start(context.Background(), h.Kind, spanName, h.Name, h.spanLease())
		return context.Background(), sp, h.Usable(nil)
	}
	ctx, sp := h.C.Tel.Start(ctx, h.Kind, spanName, h.Name, h.spanLease())
	return ctx, sp, h.Usable(ctx)
}

// BeginAcquire is Begin for an acquisition, which also fails, as not
// obtained, when ctx has already ended.
func (h *Handle) BeginAcquire(ctx context.Context, spanName, op string) (context.Context, telemetry.Span, error) {
	ctx, sp, err := h.Begin(ctx, spanName)
	if err == nil && ctx.Err() != nil {
		err = errs.NotObtained(op, h.Name, ctx)
	}
	return ctx, sp, err
}

// spanLease is the lease a span reports: fixed, watchdog (0), or none (-1)
// for primitives without holds.
func (h *Handle) spanLease() time.Duration {
	if h.Kind == telemetry.KindLatch {
		return -1
	}
	return h.Lease
}

// Terms returns the lease a hold gets and whether the watchdog renews it.
func (h *Handle) Terms() (time.Duration, bool) {
	switch {
	case h.Lease > 0:
		return time.Duration(wire.Millis(h.Lease)) * time.Millisecond, false
	case h.Renewed > 0:
		return time.Duration(wire.Millis(h.Renewed)) * time.Millisecond, true
	}
	return h.C.watchdogLease(), true
}

// MarkLease is the lease of the waiting marks of callers queued through h:
// the Core's (see Core.MarkLease), or a third of h's renewed lease when
// that is shorter, so that a dead waiter holds the queue up no longer than
// the recovery time h was given.
func (h *Handle) MarkLease() time.Duration {
	if h.Renewed > 0 {
		return min(h.C.MarkLease(), lease.MarkLease(h.Renewed))
	}
	return h.C.MarkLease()
}

// Fail turns an error from Redis met by op into dlock's error for it.
func (h *Handle) Fail(op string, err error) error {
	return errs.FromRedis(op, h.Name, h.Kind, h.Key, err)
}

// WakeUnknown wakes every local waiter after a release whose reply was lost:
// the release may have happened, and this Core ignores its own release
// messages. A needless wake-up costs one retry.
func (h *Handle) WakeUnknown(err error) {
	if errs.OutcomeUnknown(err) {
		h.C.Waits.Wake(h.Channel, wire.WakeAll, wait.WakeLocal)
	}
}

// handedTo wakes the waiters of this Core that a script handed the
// primitive to, under the holder IDs given (others are another Client's,
// which the script's message reaches, and name no waiter here), with the
// hold's fencing token, and tells this Core's other waiters on it when the
// new hold (a lease of ttl) ends: scripts publish no message for the
// waiters of the calling Client.
//
// Having woken one, the caller yields its processor, as sync.Mutex does when
// it hands over in starvation mode: the new holder, not the old one, should
// run next.
func (h *Handle) handedTo(ids []string, token uint64, ttl time.Duration) {
	if h.C.Waits.Wake(h.Channel, wire.Wake{Kind: wire.KindHanded, IDs: ids, Fence: token, TTL: ttl}, wait.WakeLocal) > 0 {
		runtime.Gosched()
	}
}

// WakeLocal applies a release message a script published to this Core's
// own waiters, whose echo the Core ignores.
func (h *Handle) WakeLocal(msg string) {
	if msg != "" {
		h.C.Waits.Wake(h.Channel, wire.DecodeRelease(msg).Wake, wait.WakeLocal)
	}
}

// Detach returns ctx without its cancellation, so that a request's outcome
// is always known; ctx's values (trace spans) remain. A ctx that cannot be
// cancelled is returned as it is.
func Detach(ctx context.Context) context.Context {
	if ctx.Done() == nil {
		return ctx
	}
	return context.WithoutCancel(ctx)
}
