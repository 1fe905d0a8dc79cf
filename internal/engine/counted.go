package engine

import (
	"context"
	"time"

	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/lease"
	"github.com/dlock-go/dlock/internal/telemetry"
	"github.com/dlock-go/dlock/internal/wait"
	"github.com/dlock-go/dlock/internal/wire"
)

// CountedOps is what a counted primitive supplies: its scripts. The one
// counted primitive left on this engine is an RWMutex's read side (its
// writers, and the ReentrantMutex, run on Reentrant).
type CountedOps interface {
	// TryScript runs the acquire script for owner, queueing as waiter when
	// markTTL > 0 and the try is refused. known is the holds this Core has
	// recorded for the owner: a hold of the owner on the server that it
	// has not recorded is a hand-over not taken yet, which the script
	// claims (count 1) instead of re-entering.
	TryScript(ctx context.Context, owner, waiter string, ttl, markTTL time.Duration, known int64) (wire.Try, error)
	// ServerCount reads the owner's hold count on the server.
	ServerCount(ctx context.Context, owner string) (int64, error)
	// ReleaseScript drops one of the owner's holds and wakes whom its
	// release lets through; it returns the owner's remaining holds (-1: it
	// held none).
	ReleaseScript(ctx context.Context, owner string) (int64, error)
	// LeaveQueue withdraws a waiting owner from the queue, passing on a lock
	// handed to it that this Core has not taken: known is the holds this
	// Core has recorded for the owner (0: any hold of the owner is such a
	// hand-over).
	LeaveQueue(ctx context.Context, owner, waiter string, known int64)
}

// Counted is one owner's hold on a counted primitive (an RWMutex's read
// side), as a call acquiring or releasing it sees it. It is the Acquirer
// of its acquisitions.
//
// Counted holds belong to an owner and count its re-entries. A Core tracks
// each in its hold table by lock key and owner (see holds.go), and every
// call that changes one runs under the owner's gate, so that the count
// recorded here follows the server's.
type Counted struct {
	H     *Handle
	Ops   CountedOps
	Owner string
	HK    string // the hold's key in the hold table (HoldKey)
	Gate  string // the owner's gate; both sides of an RWMutex share one
	// Where the hold's lease is kept, for the watchdog.
	LeaseKey string
	Extra    []string
	Spec     byte
	// Where a queued owner's place is kept.
	Waiter    string // the owner as it queues
	MarkKey   string
	MarkExtra []string
	MarkSpec  wire.Spec
	gated     bool // Try holds the owner's gate (Counted is one call's)
}

// NewAcquisition prepares an acquiring call of the owner, as waiter as.
func (k *Counted) NewAcquisition(ctx context.Context, op string, block bool, as wait.As) *Acquisition {
	return k.H.NewAcquisition(ctx, k, op, block, as)
}

// known returns the holds this Core has recorded for the owner: 0 when it
// tracks none, or only one already lost.
func (k *Counted) known() int64 {
	c := k.H.C
	if l := c.heldLease(k.HK); l != nil && c.WD.IsHeld(&l.Lease) {
		return l.Count
	}
	return 0
}

// Try is one attempt of the owner's acquisition.
func (k *Counted) Try(a *Acquisition) (bool, time.Duration, error) {
	c := k.H.C
	defer c.gate(k.Gate)()
	k.gated = true
	defer func() { k.gated = false }()
	markTTL := a.Sending()
	known := k.known()
	r, err := k.Ops.TryScript(a.TryCtx(), k.Owner, k.Waiter, a.TTL, markTTL, known)
	if err != nil {
		if errs.OutcomeUnknown(err) {
			k.reconcile(a.NC)
			if markTTL > 0 {
				k.Ops.LeaveQueue(a.NC, k.Owner, k.Waiter, k.known()) // the lost reply may have queued the owner
			}
		}
		return false, 0, k.H.Fail(a.Op, err)
	}
	if !r.Held {
		return a.Refused(r.Holder, r.Left, markTTL > 0, r.Queued, k.MarkKey, k.MarkExtra, k.MarkSpec)
	}
	return a.Granted(func() error { return k.keep(a, r.Count, r.Token) })
}

// keep records the owner's hold, count holds with token, granted on a's
// last try or handed to it. A new hold (count 1) wakes the owner's other
// waiters, which re-enter.
func (k *Counted) keep(a *Acquisition, count int64, token uint64) error {
	c := k.H.C
	if count == 1 {
		if err := a.Fresh(); err != nil {
			return err
		}
	}
	fresh := func() *lease.Hold {
		l := a.NewHold(k.LeaseKey, wire.Spec{Kind: k.Spec, ID: k.Owner})
		l.Extra, l.Token = k.Extra, token
		return l
	}
	if !c.trackHold(k.HK, count, fresh) {
		return errs.ClosedOp(a.Op, k.H.Name)
	}
	if count == 1 {
		c.Waits.Took(k.H.Channel, k.Owner)
		telemetry.Annotate(a.Ctx, telemetry.AttrToken.Int64(int64(token)))
	}
	telemetry.Annotate(a.Ctx, telemetry.AttrHoldCount.Int64(count))
	return nil
}

// GiveBack drops the grant the owner will not get.
func (k *Counted) GiveBack(a *Acquisition) { _, _ = k.Ops.ReleaseScript(a.NC, k.Owner) }

// Leave withdraws a waiting owner from the queue, unless another call of the
// same owner on this Core still waits there as the same kind of waiter:
// they share the owner's place. (The owner's writers waiting do not: each
// has a place of its own.) A hand-over to the owner that no call of it took
// passes on.
func (k *Counted) Leave(a *Acquisition) {
	c := k.H.C
	if c.Waits.HasOwner(k.H.Channel, k.Owner, a.As.Kind) {
		return
	}
	if !k.gated { // Refused calls Leave from within Try, which holds the gate
		defer c.gate(k.Gate)()
	}
	k.Ops.LeaveQueue(a.NC, k.Owner, k.Waiter, k.known())
}

// reconcile runs after an acquisition whose reply was lost. If the server
// counts one hold more than this Client knew of, the attempt went through;
// since the caller gets an error, that hold is given back. The owner's gate
// is held and only this Client writes the owner's count, so the difference
// can only come from that attempt.
func (k *Counted) reconcile(ctx context.Context) {
	var known int64
	if l := k.H.C.heldLease(k.HK); l != nil {
		known = l.Count
	}
	if cur, err := k.Ops.ServerCount(ctx, k.Owner); err == nil && cur == known+1 {
		_, _ = k.Ops.ReleaseScript(ctx, k.Owner)
	}
}

// Release drops one of the owner's holds (Unlock, RUnlock).
func (k *Counted) Release(ctx context.Context, op string) error {
	c := k.H.C
	defer c.gate(k.Gate)()
	l := c.heldLease(k.HK)
	if l != nil {
		if err := k.H.LostAlready(op, l); err != nil {
			c.forgetHold(k.HK, l)
			return err
		}
	}
	k.H.BeginRelease(l)
	n, err := k.Ops.ReleaseScript(Detach(ctx), k.Owner)
	if err != nil {
		err = k.H.Fail(op, err)
	}
	if err == nil && n <= 0 && l != nil {
		c.forgetHold(k.HK, l)
	}
	return k.H.SettleRelease(op, l, n, err, false)
}

// Hold returns the hold this Core tracks for the owner, or nil.
func (k *Counted) Hold() *lease.Hold { return k.H.C.heldLease(k.HK) }
