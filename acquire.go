package dlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlock-go/dlock/internal/wait"

	"github.com/dlock-go/dlock/internal/lease"
	"github.com/dlock-go/dlock/internal/telemetry"
	"github.com/dlock-go/dlock/internal/wire"
)

// The acquisition lifecycle, shared by every call that takes a hold (Lock,
// TryLock, RLock, TryRLock, Acquire, TryAcquire):
//
//  1. try: the primitive runs its script once. Tries run with the caller's
//     ctx detached from its cancellation, so their outcome is always known.
//  2. A grant becomes a hold the watchdog keeps, unless ctx ended meanwhile or
//     the Client closed: then it is given back, so that a failed call leaves
//     nothing behind.
//  3. A refused try of a blocking call may leave a place in the primitive's
//     queue in Redis; the place is a mark the watchdog renews while the
//     caller waits, and is replaced when a later try has to queue again.
//  4. The caller waits (see wait.go) and tries again when woken. A release
//     may hand it the lock outright; it then holds it without another try.
//  5. A caller that gives up leaves the queue, passing on a lock that was
//     handed to it meanwhile.
//
// Each primitive supplies only what is its own: its scripts and their
// replies, where its holds are recorded, and whom its releases wake.

// acquisition is one acquiring call in progress.
type acquisition struct {
	h     *handle
	p     acquirer
	ctx   context.Context // the caller's, with its span
	nc    context.Context // ctx detached from its cancellation, for tries
	op    string          // "lock", "rlock", "acquire": for errors
	block bool            // a blocking call: refused tries queue and wait
	ttl   time.Duration   // the lease a hold gets
	renew bool            // the watchdog renews the hold
	// grantTTL, when set, is the lease a hand-over grant runs on until its
	// first renewal: what was left of the caller's mark.
	grantTTL time.Duration
	sent     time.Time   // when the last try was sent
	as       wait.As     // the caller as a waiter
	mark     *lease.Mark // the caller's place in the queue in Redis, if any
	// requeued: the caller lost its first place and queued again, so a late
	// hand-over message may be for the earlier place.
	requeued bool
	ack      replicaAck // WithSyncReplicas: what the WAIT after the last try answered
}

// acquirer is what a primitive supplies to the lifecycle.
type acquirer interface {
	// try makes one attempt: it runs the primitive's script (queueing when
	// the call blocks and the primitive queues), and settles a grant with
	// a.granted or a refusal with a.refused.
	try(a *acquisition) (ok bool, left time.Duration, err error)
	// giveBack releases a grant the caller will not get.
	giveBack(a *acquisition)
	// leave withdraws a caller that stops waiting from the queue in Redis,
	// passing on a lock a release handed to it meanwhile.
	leave(a *acquisition)
}

// newAcquisition prepares an acquiring call of h with the caller's ctx.
func (h *handle) newAcquisition(ctx context.Context, p acquirer, op string, block bool, as wait.As) *acquisition {
	ttl, renew := h.terms()
	if as.Metric == "" {
		as.Metric = h.kind
	}
	if as.ID == "" {
		as.ID = h.c.waiterID()
	}
	return &acquisition{h: h, p: p, ctx: ctx, nc: detach(ctx), op: op, block: block, ttl: ttl, renew: renew, as: as}
}

// run acquires: one try, and for a blocking call, waiting and trying again
// until a try succeeds, ctx ends or the Client closes. It reports whether
// the caller now holds; a non-blocking call that found the lock taken
// returns (false, nil).
//
// A blocking call on a primitive this Client already has callers waiting
// for skips its first try: the primitive is held, and the wait, whose
// subscription is in place, tries at once and queues. That saves a round
// trip on every contended call.
func (a *acquisition) run() (_ bool, err error) {
	c := a.h.c
	var left time.Duration
	warm := c.renewals.WarmUp()
	defer func() { warm(err) }() // settles the warm-ups of a call that never tried
	if !a.as.Local && (!a.block || !c.waits.Has(a.h.channel)) {
		ok, l, err := a.p.try(a)
		warm(err)
		if err != nil || ok || !a.block {
			return ok, err
		}
		left = l
	}
	err = c.loop.Wait(a.ctx, a.op, a.h.name, a.h.channel, a.as, left, func() (bool, time.Duration, error) {
		ok, left, err := a.p.try(a)
		warm(err)
		return ok, left, err
	})
	if a.mark != nil {
		c.wd.Dropped(&a.mark.Lease)
	}
	if err != nil {
		a.p.leave(a)
		return false, err
	}
	return true, nil
}

// granted settles a try that the server granted: keep records the hold,
// unless ctx ended meanwhile, in which case the grant is given back and the
// call fails as not obtained. With WithSyncReplicas, a grant that too few
// replicas acknowledged is given back and the call fails (ErrNotReplicated).
// A keep that fails gives the grant back too: the Client closed, or the
// grant came too late to be worth a hold (errStale), in which case a
// blocking call tries again at once.
func (a *acquisition) granted(keep func() error) (bool, time.Duration, error) {
	if a.ctx.Err() != nil {
		a.p.giveBack(a)
		return false, 0, notObtained(a.op, a.h.name, a.ctx)
	}
	if err := a.replicated(); err != nil {
		a.p.giveBack(a)
		return false, 0, err
	}
	err := keep()
	if err == nil {
		return true, 0, nil
	}
	a.p.giveBack(a)
	var stale *staleGrant
	if errors.As(err, &stale) && a.block {
		a.h.c.cfg.logger.Warn("dlock: grant came too late; given back, trying again",
			"name", a.h.name, "lease_left", stale.left.String(), "lease", stale.ttl.String())
		return false, time.Nanosecond, nil // try again at once
	}
	return false, 0, err
}

// fresh checks that a new hold granted on the try sent at a.sent has at
// least minValidity of its lease left. Keep functions call it before
// recording a new hold (not a re-entry, which keeps the first hold's lease).
func (a *acquisition) fresh() error {
	ttl := a.ttl
	if a.grantTTL > 0 {
		ttl = a.grantTTL
	}
	left := time.Until(lease.Deadline(a.sent, ttl))
	if left >= lease.MinValidity(ttl) {
		return nil
	}
	return &staleGrant{op: a.op, name: a.h.name, left: left, ttl: ttl}
}

// sending records that a try is being sent now, with the lease's own
// terms, and returns the waiting mark's lease the try asks for: a blocking
// call queues when refused, a non-blocking one (0) does not.
func (a *acquisition) sending() (markTTL time.Duration) {
	a.sent, a.grantTTL = time.Now(), 0
	if a.block {
		markTTL = a.h.markLease()
	}
	return markTTL
}

// newHold makes the record of a hold the server granted on this
// acquisition's last try, or handed to it.
func (a *acquisition) newHold(key string, spec wire.Spec) *lease.Hold {
	l := lease.NewHold(a.ctx, a.h.name, a.h.kind, key, spec, a.ttl, a.renew, a.sent)
	l.GrantTTL = a.grantTTL
	return l
}

// staleGrant is the error of a grant that arrived with too little of its
// lease left to be returned as a hold.
type staleGrant struct {
	op, name  string
	left, ttl time.Duration
}

func (e *staleGrant) Error() string {
	return opErr(e.op, e.name, fmt.Sprintf("granted with %v of its %v lease left, less than the %v minimum; given back",
		e.left.Round(time.Millisecond), e.ttl, lease.MinValidity(e.ttl)), ErrNotObtained).Error()
}

func (e *staleGrant) Unwrap() error { return ErrNotObtained }

// refused settles a try that found the primitive held, by holder, whose
// lease has left to run. When the try left the caller queued (queued), the
// caller's mark is kept, or replaced if the watchdog found it gone; anew
// says the script queued the caller afresh, so a caller that had a place
// lost it. Either way it has queued again.
func (a *acquisition) refused(holder string, left time.Duration, queued, anew bool, markKey string, extra []string, spec wire.Spec) (bool, time.Duration, error) {
	if holder != "" {
		telemetry.Blocked(a.ctx, holder, left)
	}
	if !queued {
		return false, left, nil
	}
	c := a.h.c
	if a.mark != nil && anew {
		a.requeued = true
	}
	if a.mark != nil && c.wd.IsHeld(&a.mark.Lease) {
		return false, left, nil
	}
	id := a.as.ID
	m := lease.NewMark(markKey, extra, spec, a.h.markLease(), a.sent, func() {
		// The place is gone: the lock was handed over (then a try takes it)
		// or the place was purged (then a try queues again).
		c.waits.Wake(a.h.channel, wire.Wake{IDs: []string{id}}, wait.WakeLocal)
	})
	if !c.wd.Add(&m.Lease) {
		a.p.leave(a)
		return false, 0, closedErr(a.op, a.h.name)
	}
	a.requeued = a.requeued || a.mark != nil
	a.mark = m
	return false, left, nil
}

// handedGrant reports whether a hand-over message can be taken as the grant
// without asking Redis again, and if so, sets the terms of the grant: the
// handed lock's lease is what remained of the caller's mark, which the
// watchdog renewed, so the hold's first deadline is the mark's, and it must
// leave minValidity of the mark's lease, as any fresh grant must of its own. A WithLease caller
// asks again, which sets its own lease; so does one that lost its place and
// queued again, since the message may be a late one for the earlier place,
// whose hold may have run out and gone to someone else. So does every caller
// with WithSyncReplicas, whose claim is followed by WAIT (see syncreplicas.go).
func (a *acquisition) handedGrant() bool {
	if !a.renew || a.mark == nil || a.requeued || a.h.c.cfg.sync.replicas > 0 {
		return false
	}
	sent := a.h.c.wd.LastSent(&a.mark.Lease)
	if time.Until(lease.Deadline(sent, a.mark.TTL)) < lease.MinValidity(a.mark.TTL) {
		return false
	}
	a.sent, a.grantTTL = sent, a.mark.TTL
	return true
}

// watch hands a new hold to the watchdog. After Close nothing would keep or
// report it, so it fails with ErrClosed and the caller gives the grant back.
func (a *acquisition) watch(l *lease.Hold) error {
	if !a.h.c.wd.Add(&l.Lease) {
		return closedErr(a.op, a.h.name)
	}
	return nil
}

// detach returns ctx without its cancellation, so that a request's outcome
// is always known; ctx's values (trace spans) remain. A ctx that cannot be
// cancelled is returned as it is.
func detach(ctx context.Context) context.Context {
	if ctx.Done() == nil {
		return ctx
	}
	return context.WithoutCancel(ctx)
}
