package dlock

import (
	"context"
	"runtime"
	"time"

	"github.com/dlock-go/dlock/internal/wait"

	"github.com/dlock-go/dlock/internal/lease"
	"github.com/dlock-go/dlock/internal/telemetry"
	"github.com/dlock-go/dlock/internal/wire"
)

// handle is what every primitive's handle shares: its Client, its kind and
// name, its main key and channel, its lease, and the error bad input left,
// which every call then returns.
type handle struct {
	c       *Client
	kind    string // the dlock.kind attribute (telemetry.KindMutex, ...)
	name    string
	key     string        // p{name}; auxiliary keys add a suffix
	channel string        // where releases are published
	keys    []string      // every key of the primitive, main key first, then the channel
	lease   time.Duration // fixed lease; 0: the watchdog renews holds
	renewed time.Duration // the lease the watchdog renews (WithRenewedLease); 0: the Client's
	err     error
}

// newHandle makes the handle of a primitive whose auxiliary keys are its
// main key with the given suffixes.
func (c *Client) newHandle(kind, name string, lease time.Duration, err error, suffixes ...string) handle {
	if err == nil {
		err = wire.CheckName(name)
	}
	key := wire.LockKey(c.cfg.prefix, name)
	h := handle{c: c, kind: kind, name: name, key: key, channel: wire.ChannelOf(key), lease: lease, err: err}
	h.keys = append(h.keys, key)
	for _, s := range suffixes {
		h.keys = append(h.keys, key+s)
	}
	h.keys = append(h.keys, h.channel)
	return h
}

// usable reports the error a call must return before touching Redis: a bad
// Client or handle, or a closed Client.
func (h *handle) usable(ctx context.Context) error {
	switch c := h.c; {
	case c.err != nil:
		return c.err
	case h.err != nil:
		return h.err
	case ctx == nil:
		return invalidf("nil context")
	case c.closed.Load():
		return ErrClosed
	}
	return nil
}

// begin opens the span of a call that is not an acquisition (a release, a
// count-down) and checks that it may proceed. The span is open even when an
// error is returned, so the caller can end it with that error.
func (h *handle) begin(ctx context.Context, spanName string) (context.Context, telemetry.Span, error) {
	if ctx == nil {
		_, sp := h.c.tel.Start(context.Background(), h.kind, spanName, h.name, h.spanLease())
		return context.Background(), sp, h.usable(nil)
	}
	ctx, sp := h.c.tel.Start(ctx, h.kind, spanName, h.name, h.spanLease())
	return ctx, sp, h.usable(ctx)
}

// beginAcquire is begin for an acquisition, which also fails, as not
// obtained, when ctx has already ended.
func (h *handle) beginAcquire(ctx context.Context, spanName, op string) (context.Context, telemetry.Span, error) {
	ctx, sp, err := h.begin(ctx, spanName)
	if err == nil && ctx.Err() != nil {
		err = notObtained(op, h.name, ctx)
	}
	return ctx, sp, err
}

// spanLease is the lease a span reports: fixed, watchdog (0), or none (-1)
// for primitives without holds.
func (h *handle) spanLease() time.Duration {
	if h.kind == telemetry.KindLatch {
		return -1
	}
	return h.lease
}

// terms returns the lease a hold gets and whether the watchdog renews it.
func (h *handle) terms() (time.Duration, bool) {
	switch {
	case h.lease > 0:
		return time.Duration(millis(h.lease)) * time.Millisecond, false
	case h.renewed > 0:
		return time.Duration(millis(h.renewed)) * time.Millisecond, true
	}
	return h.c.watchdogLease(), true
}

// markLease is the lease of the waiting marks of callers queued through h:
// the Client's (see Client.markLease), or a third of h's renewed lease when
// that is shorter, so that a dead waiter holds the queue up no longer than
// the recovery time h was given.
func (h *handle) markLease() time.Duration {
	if h.renewed > 0 {
		return min(h.c.markLease(), lease.MarkLease(h.renewed))
	}
	return h.c.markLease()
}

// watchdogLease is the lease of holds the watchdog renews, in whole
// milliseconds.
func (c *Client) watchdogLease() time.Duration {
	return time.Duration(millis(c.cfg.watchdog)) * time.Millisecond
}

// markLease is the lease of a waiting caller's place in a queue: a third of
// the watchdog timeout, renewed three times as often as holds. A waiter that
// dies then holds its queue up for at most that long: the lock may be handed
// to it first, for what is left of its mark.
func (c *Client) markLease() time.Duration { return lease.MarkLease(c.cfg.watchdog) }

// fail turns an error from Redis met by op into dlock's error for it.
func (h *handle) fail(op string, err error) error { return redisErr(op, h.name, h.kind, h.key, err) }

// wakeUnknown wakes every local waiter after a release whose reply was lost:
// the release may have happened, and this Client ignores its own release
// messages. A needless wake-up costs one retry.
func (h *handle) wakeUnknown(err error) {
	if outcomeUnknown(err) {
		h.c.waits.Wake(h.channel, wire.WakeAll, wait.WakeLocal)
	}
}

// handedTo wakes the waiters of this Client that a script handed the
// primitive to, under the holder IDs given (others are another Client's,
// which the script's message reaches, and name no waiter here), with the
// hold's fencing token, and tells this Client's other waiters on it when
// the new hold (a lease of ttl) ends: scripts publish no message for the
// waiters of the calling Client.
//
// Having woken one, the caller yields its processor, as sync.Mutex does when
// it hands over in starvation mode: the new holder, not the old one, should
// run next.
func (h *handle) handedTo(ids []string, token uint64, ttl time.Duration) {
	if h.c.waits.Wake(h.channel, wire.Wake{Kind: wire.KindHanded, IDs: ids, Fence: token, TTL: ttl}, wait.WakeLocal) > 0 {
		runtime.Gosched()
	}
}

// wakeLocal applies a release message a script published to this Client's
// own waiters, whose echo the Client ignores.
func (h *handle) wakeLocal(msg string) {
	if msg != "" {
		h.c.waits.Wake(h.channel, wire.DecodeRelease(msg).Wake, wait.WakeLocal)
	}
}
