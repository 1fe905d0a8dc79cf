package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/lease"
	"github.com/dlock-go/dlock/internal/telemetry"
	"github.com/dlock-go/dlock/internal/wait"
	"github.com/dlock-go/dlock/internal/wire"
)

// The acquisition lifecycle, shared by every call that takes a hold (Lock,
// TryLock, RLock, TryRLock, Acquire, TryAcquire):
//
//  1. Try: the primitive runs its script once. Tries run with the caller's
//     ctx detached from its cancellation, so their outcome is always known.
//  2. A grant becomes a hold the watchdog keeps, unless ctx ended meanwhile or
//     the Client closed: then it is given back, so that a failed call leaves
//     nothing behind.
//  3. A refused try of a blocking call may leave a place in the primitive's
//     queue in Redis; the place is a mark the watchdog renews while the
//     caller waits, and is replaced when a later try has to queue again.
//  4. The caller waits (see internal/wait) and tries again when woken. A
//     release may hand it the lock outright; it then holds it without
//     another try.
//  5. A caller that gives up leaves the queue, passing on a lock that was
//     handed to it meanwhile.
//
// Each primitive supplies only what is its own (an Acquirer): its scripts
// and their replies, where its holds are recorded, and whom its releases
// wake.

// Acquisition is one acquiring call in progress.
type Acquisition struct {
	H     *Handle
	p     Acquirer
	Ctx   context.Context // the caller's, with its span
	NC    context.Context // Ctx detached from its cancellation, for tries
	Op    string          // "lock", "rlock", "acquire": for errors
	Block bool            // a blocking call: refused tries queue and wait
	TTL   time.Duration   // the lease a hold gets
	renew bool            // the watchdog renews the hold
	// grantTTL, when set, is the lease a hand-over grant runs on until its
	// first renewal: what was left of the caller's mark.
	grantTTL time.Duration
	Sent     time.Time   // when the last try was sent
	As       wait.As     // the caller as a waiter
	mark     *lease.Mark // the caller's place in the queue in Redis, if any
	// requeued: the caller lost its first place and queued again, so a late
	// hand-over message may be for the earlier place.
	requeued bool
	ack      replicaAck // WithSyncReplicas: what the WAIT after the last try answered
}

// Acquirer is what a primitive supplies to the lifecycle.
type Acquirer interface {
	// Try makes one attempt: it runs the primitive's script (queueing when
	// the call blocks and the primitive queues), and settles a grant with
	// a.Granted or a refusal with a.Refused.
	Try(a *Acquisition) (ok bool, left time.Duration, err error)
	// GiveBack releases a grant the caller will not get.
	GiveBack(a *Acquisition)
	// Leave withdraws a caller that stops waiting from the queue in Redis,
	// passing on a lock a release handed to it meanwhile.
	Leave(a *Acquisition)
}

// NewAcquisition prepares an acquiring call of h with the caller's ctx.
func (h *Handle) NewAcquisition(ctx context.Context, p Acquirer, op string, block bool, as wait.As) *Acquisition {
	ttl, renew := h.Terms()
	if as.Metric == "" {
		as.Metric = h.Kind
	}
	if as.ID == "" {
		as.ID = h.C.WaiterID()
	}
	return &Acquisition{H: h, p: p, Ctx: ctx, NC: Detach(ctx), Op: op, Block: block, TTL: ttl, renew: renew, As: as}
}

// Run acquires: one try, and for a blocking call, waiting and trying again
// until a try succeeds, ctx ends or the Client closes. It reports whether
// the caller now holds; a non-blocking call that found the lock taken
// returns (false, nil).
//
// A blocking call on a primitive this Core already has callers waiting
// for skips its first try: the primitive is held, and the wait, whose
// subscription is in place, tries at once and queues. That saves a round
// trip on every contended call.
func (a *Acquisition) Run() (_ bool, err error) {
	c := a.H.C
	var left time.Duration
	warm := c.renewals.WarmUp()
	defer func() { warm(err) }() // settles the warm-ups of a call that never tried
	if !a.As.Local && (!a.Block || !c.Waits.Has(a.H.Channel)) {
		ok, l, err := a.p.Try(a)
		warm(err)
		if err != nil || ok || !a.Block {
			return ok, err
		}
		left = l
	}
	if hook := c.Hooks.BeforeLocalWait; hook != nil && a.As.Local {
		hook()
	}
	err = c.Loop.Wait(a.Ctx, a.Op, a.H.Name, a.H.Channel, a.As, left, func() (bool, time.Duration, error) {
		ok, left, err := a.p.Try(a)
		warm(err)
		return ok, left, err
	})
	if a.mark != nil {
		c.WD.Dropped(&a.mark.Lease)
	}
	if err != nil {
		a.p.Leave(a)
		return false, err
	}
	return true, nil
}

// Granted settles a try that the server granted: keep records the hold,
// unless ctx ended meanwhile, in which case the grant is given back and the
// call fails as not obtained. With WithSyncReplicas, a grant that too few
// replicas acknowledged is given back and the call fails (ErrNotReplicated).
// A keep that fails gives the grant back too: the Client closed, or the
// grant came too late to be worth a hold (staleGrant), in which case a
// blocking call tries again at once.
func (a *Acquisition) Granted(keep func() error) (bool, time.Duration, error) {
	if a.Ctx.Err() != nil {
		a.p.GiveBack(a)
		return false, 0, errs.NotObtained(a.Op, a.H.Name, a.Ctx)
	}
	if err := a.replicated(); err != nil {
		a.p.GiveBack(a)
		return false, 0, err
	}
	err := keep()
	if err == nil {
		return true, 0, nil
	}
	a.p.GiveBack(a)
	var stale *staleGrant
	if errors.As(err, &stale) && a.Block {
		a.H.C.Cfg.Logger.Warn("dlock: grant came too late; given back, trying again",
			"name", a.H.Name, "lease_left", stale.left.String(), "lease", stale.ttl.String())
		return false, time.Nanosecond, nil // try again at once
	}
	return false, 0, err
}

// Fresh checks that a new hold granted on the try sent at a.Sent has at
// least lease.MinValidity of its lease left. Keep functions call it before
// recording a new hold (not a re-entry, which keeps the first hold's lease).
func (a *Acquisition) Fresh() error {
	ttl := a.TTL
	if a.grantTTL > 0 {
		ttl = a.grantTTL
	}
	left := time.Until(lease.Deadline(a.Sent, ttl))
	if left >= lease.MinValidity(ttl) {
		return nil
	}
	return &staleGrant{op: a.Op, name: a.H.Name, left: left, ttl: ttl}
}

// Sending records that a try is being sent now, with the lease's own
// terms, and returns the waiting mark's lease the try asks for: a blocking
// call queues when refused, a non-blocking one (0) does not.
func (a *Acquisition) Sending() (markTTL time.Duration) {
	a.Sent, a.grantTTL = time.Now(), 0
	if a.Block {
		markTTL = a.H.MarkLease()
	}
	return markTTL
}

// NewHold makes the record of a hold the server granted on this
// acquisition's last try, or handed to it.
func (a *Acquisition) NewHold(key string, spec wire.Spec) *lease.Hold {
	l := lease.NewHold(a.Ctx, a.H.Name, a.H.Kind, key, spec, a.TTL, a.renew, a.Sent)
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
	return errs.Op(e.op, e.name, fmt.Sprintf("granted with %v of its %v lease left, less than the %v minimum; given back",
		e.left.Round(time.Millisecond), e.ttl, lease.MinValidity(e.ttl)), errs.ErrNotObtained).Error()
}

func (e *staleGrant) Unwrap() error { return errs.ErrNotObtained }

// Refused settles a try that found the primitive held, by holder, whose
// lease has left to run. When the try left the caller queued (queued), the
// caller's mark is kept, or replaced if the watchdog found it gone; anew
// says the script queued the caller afresh, so a caller that had a place
// lost it. Either way it has queued again. The mark is kept under markKey
// (with the companion keys extra) as spec.
func (a *Acquisition) Refused(holder string, left time.Duration, queued, anew bool, markKey string, extra []string, spec wire.Spec) (bool, time.Duration, error) {
	if holder != "" {
		telemetry.Blocked(a.Ctx, holder, left)
	}
	if !queued {
		return false, left, nil
	}
	c := a.H.C
	if a.mark != nil && anew {
		a.requeued = true
	}
	if a.mark != nil && c.WD.IsHeld(&a.mark.Lease) {
		return false, left, nil
	}
	id := a.As.ID
	m := lease.NewMark(markKey, extra, spec, a.H.MarkLease(), a.Sent, func() {
		// The place is gone: the lock was handed over (then a try takes it)
		// or the place was purged (then a try queues again).
		c.Waits.Wake(a.H.Channel, wire.Wake{IDs: []string{id}}, wait.WakeLocal)
	})
	if !c.WD.Add(&m.Lease) {
		a.p.Leave(a)
		return false, 0, errs.ClosedOp(a.Op, a.H.Name)
	}
	a.requeued = a.requeued || a.mark != nil
	a.mark = m
	return false, left, nil
}

// handedGrant reports whether a hand-over message can be taken as the grant
// without asking Redis again, and if so, sets the terms of the grant: the
// handed lock's lease is what remained of the caller's mark, which the
// watchdog renewed, so the hold's first deadline is the mark's, and it must
// leave lease.MinValidity of the mark's lease, as any fresh grant must of
// its own. A WithLease caller asks again, which sets its own lease; so does
// one that lost its place and queued again, since the message may be a
// late one for the earlier place, whose hold may have run out and gone to
// someone else. So does every caller with WithSyncReplicas, whose claim is
// followed by WAIT (see syncreplicas.go).
func (a *Acquisition) handedGrant() bool {
	if !a.renew || a.mark == nil || a.requeued || a.H.C.Cfg.Sync.Replicas > 0 {
		return false
	}
	sent := a.H.C.WD.LastSent(&a.mark.Lease)
	if time.Until(lease.Deadline(sent, a.mark.TTL)) < lease.MinValidity(a.mark.TTL) {
		return false
	}
	a.Sent, a.grantTTL = sent, a.mark.TTL
	return true
}

// TakeHanded takes a hand-over from its message alone: a release made the
// caller the holder, with token and what was left of its waiting mark as
// the lease (see handedGrant). keep records the hold, as for a granted try.
// It declines (false, nil: a try follows, and claims the hand-over) when
// the message names no token or the grant's terms do not allow it.
func (a *Acquisition) TakeHanded(token uint64, keep func(token uint64) error) (bool, error) {
	if token == 0 || !a.handedGrant() {
		return false, nil
	}
	ok, _, err := a.Granted(func() error { return keep(token) })
	return ok, err
}

// Watch hands a new hold to the watchdog. After Close nothing would keep or
// report it, so it fails with ErrClosed and the caller gives the grant back.
func (a *Acquisition) Watch(l *lease.Hold) error {
	if !a.H.C.WD.Add(&l.Lease) {
		return errs.ClosedOp(a.Op, a.H.Name)
	}
	return nil
}
