package engine

import (
	"context"
	"fmt"

	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/lease"
	"github.com/dlock-go/dlock/internal/telemetry"
)

// Reentrant is the engine of a ReentrantMutex on one Redis: the Mutex
// engine, plus a table of owners.
//
// Owners are scoped to their Client, so no other process ever acts as one,
// and the hold in Redis need not be named by its owner. Each Redis grant is
// a Mutex grant: a fresh ID per acquisition (its own waiter's place,
// reserved tokens, handoffs claimed from their message, lock cohorting),
// made by a Mutex engine of its own for the call (view). The Core's hold
// table maps the owner to that hold (and to the view, whose slot keeps it):
//
//   - a Lock of an owner that holds re-enters the grant: excl_try with the
//     grant's ID and the owner's count adds one hold in Redis, so that
//     Redis's n follows the count of the grant's current owner. The Core's
//     count is the truth (owners are the Client's, and every change runs
//     under the owner's gate): a reply lost or a command run twice may
//     leave Redis's n off, which costs nothing but its display;
//   - an Unlock of an owner that holds more than once drops one in Redis
//     (excl_unlock with the grant's ID); its last hold, by the Core's
//     count, goes through the Mutex engine's Release, which hands it to a
//     goroutine of the Client waiting for the lock (any owner's: a cohort)
//     or frees it in Redis, whatever Redis's n says;
//   - an Unlock of an owner without a hold is answered here, with no round
//     trip: nobody else can hold as this owner.
//
// Calls of one owner run in parallel. The first of them to be granted
// records the hold and wakes the others waiting (Registry.Took, through
// their wait.As.Owner); they re-enter and take their own places out of the
// queue (reenter). A hold that a local handoff gave to a waiting owner is
// recorded when its Lock returns. Every change of an owner's record runs
// under the owner's gate, in the order Redis applied it.
type Reentrant struct {
	h      *Handle
	x      *Excl // the lock's scripts as a counted kind (re-entry, inner Unlocks, State)
	xf     *Excl // as an uncounted one: a grant's tries and its last release, which frees it
	cohort CohortBound
}

// NewReentrant returns the engine of the ReentrantMutex whose handle is h
// (made with ExclKeys).
func NewReentrant(h *Handle, cohort CohortBound) *Reentrant {
	return &Reentrant{h: h, x: NewExcl(h, true), xf: NewExcl(h, false), cohort: cohort}
}

// NewRWWrite returns the engine of the write side of the RWMutex whose
// handle is h (made with RWKeys): a ReentrantMutex's, over the rw_*.lua
// scripts, whose writes Redis names by grant ID (see
// internal/scripts/rw_common.lua). Its owners' read holds are the
// RWMutex's read side's (Counted): a local handoff skips an owner that
// reads, either way (see passLocal).
func NewRWWrite(h *Handle, cohort CohortBound) *Reentrant {
	return &Reentrant{h: h, x: NewRWWriteExcl(h, true), xf: NewRWWriteExcl(h, false), cohort: cohort}
}

// Excl returns the exclusive lock the engine runs on.
func (r *Reentrant) Excl() *Excl { return r.x }

// view is a Mutex engine over r's lock for one acquiring call of owner,
// with a slot of its own for the grant.
func (r *Reentrant) view(owner string) *Mutex {
	return &Mutex{h: r.h, x: r.xf.forOwner(owner), slot: &Slot{}, cohort: r.cohort, owner: owner, cx: r.x.forOwner(owner)}
}

// Acquire runs one Lock or TryLock of owner: a re-entry if the owner
// holds, else an acquisition of a grant of its own.
func (r *Reentrant) Acquire(ctx context.Context, owner, op string, block bool) (bool, error) {
	m := r.view(owner)
	a, t := m.acquisition(ctx, op, block)
	if done, ok, err := t.reenter(a, false); done {
		return ok, err
	}
	ok, err := a.Run()
	if !ok || err != nil || t.reentered {
		return ok, err
	}
	l := m.slot.Get()
	if l == nil {
		// Abandoned: nothing hands a hold out of a slot whose Lock has not
		// returned, but the hold may have been lost and given back.
		return false, errs.Op(op, r.h.Name, "", errs.ErrLost)
	}
	c := r.h.C
	if hook := c.Hooks.BeforeRecordGrant; hook != nil {
		hook(l)
	}
	hk := HoldKey(r.h.Key, owner)
	unlock := c.gate(hk)
	c.recordGrant(hk, l, m)
	unlock()
	if c.isForced(l) {
		// A ForceUnlock's notice came before the record, which its look
		// for the grant's holds (forceNotice) missed.
		c.WD.Lose(&l.Lease, errForced)
	}
	if c.Waits.Has(r.h.Channel) {
		c.Waits.Took(r.h.Channel, owner) // the owner's other calls re-enter
	}
	return true, nil
}

// reenter makes t's call a re-entry when the Core records a live hold of
// its owner: excl_try with the hold's grant ID and count adds one hold. It
// reports done when it settled the call (ok, or an error). A re-entry that
// finds the grant gone reports the hold lost and leaves the call to try
// for a grant of its own (done false). A call that may have a place in
// Redis (placed) takes it out: it will not need it.
func (t *mutexTry) reenter(a *Acquisition, placed bool) (done, ok bool, err error) {
	m := t.m
	c := m.h.C
	if m.owner == "" {
		return false, false, nil
	}
	hk := HoldKey(m.h.Key, m.owner)
	if c.heldLease(hk) == nil { // the usual case: no gate needed to say so
		return false, false, nil
	}
	defer c.gate(hk)()
	l := c.heldLease(hk)
	if l == nil || !c.WD.IsHeld(&l.Lease) {
		return false, false, nil
	}
	id := l.Spec.ID
	a.Sending() // a re-entry never queues
	r, err := m.cx.Try(a.TryCtx(), m.cx.waiter(0, 0, id), id, 0, a.TTL, 0, l.Count)
	if err != nil {
		if errs.OutcomeUnknown(err) {
			m.h.WakeUnknown(err) // it may have handed a free lock to a waiter here
			if settleLostReentry(a.NC, m, hk, l) {
				return false, false, nil // the grant was gone: acquire anew
			}
		}
		return true, false, m.h.Fail(a.Op, err)
	}
	switch {
	case r.Held && r.Count > 1:
		t.reentry = l
		ok, _, err = a.Granted(func() error {
			l.Count++ // the Core's count (Redis's may be off: see Reentrant)
			telemetry.Annotate(a.Ctx, telemetry.AttrHoldCount.Int64(l.Count))
			return nil
		})
		t.reentry = nil
		if ok {
			t.reentered = true
			if placed && a.Block {
				// It queued, or the end of a cohort queued it, before its
				// owner held: leave.
				m.x.Cancel(a.NC, t.waiter)
			}
		}
		return true, ok, err
	case r.Held:
		// The grant was gone and the lock free: the try took it afresh
		// under the old ID, without the terms of a grant of this call.
		_, _ = m.x.Unlock(a.NC, id) // (uncounted: it frees)
	}
	c.WD.Lose(&l.Lease, errGoneBeforeReentry)
	c.forgetHold(hk, l)
	return false, false, nil
}

var (
	errGoneBeforeReentry = fmt.Errorf("%w: hold gone before the owner locked again", errs.ErrLost)
	errCountBehind       = fmt.Errorf("%w: Redis counted fewer holds than the owner's, and freed the lock", errs.ErrLost)
)

// settleLostReentry reads the lock back (excl_state) after a re-entry of
// hold l whose reply was lost, and undoes what the try did: a hold it added is dropped
// (so that Redis's count goes on matching the Core's); a lock it took
// afresh under the grant's ID (the grant was gone) is freed, and l reported
// lost, as is l when another holds. It reports whether l was gone. A read
// that fails leaves Redis's count as it may be: the Core's decides.
func settleLostReentry(ctx context.Context, m *Mutex, hk string, l *lease.Hold) (gone bool) {
	c := m.h.C
	st, err := m.cx.State(ctx)
	if err != nil {
		return false
	}
	grant := l.Token
	if l.Cohort.End > 0 {
		grant = l.Cohort.Grant // a local hold's token is one of the grant's block
	}
	switch {
	case st.Holder == l.Spec.ID && st.Token == grant:
		if st.Count > l.Count {
			_, _ = m.cx.Unlock(ctx, l.Spec.ID)
		}
		return false
	case st.Holder == l.Spec.ID:
		_, _ = m.x.Unlock(ctx, l.Spec.ID) // taken afresh (uncounted: it frees)
	}
	c.WD.Lose(&l.Lease, errGoneBeforeReentry)
	c.forgetHold(hk, l)
	return true
}

// Release drops one hold of owner (Unlock).
func (r *Reentrant) Release(ctx context.Context, owner, op string) error {
	c := r.h.C
	hk := HoldKey(r.h.Key, owner)
	defer c.gate(hk)()
	l, m := c.grantOf(hk)
	if l == nil {
		return errs.Op(op, r.h.Name, "", errs.ErrNotHeld)
	}
	if err := r.h.LostAlready(op, l); err != nil {
		c.forgetHold(hk, l)
		m.slot.TakeIf(l)
		return err
	}
	if l.Count > 1 {
		r.h.BeginRelease(l)
		n, err := r.x.Unlock(Detach(ctx), l.Spec.ID)
		switch {
		case err != nil:
			// Redis may or may not have dropped its count, which only
			// Status shows: the owner's count drops all the same, and the
			// hold goes on, renewed. (Reporting the error would invite a
			// retry, which would drop a hold the owner still has.)
			return r.h.SettleRelease(op, l, l.Count-1, nil, false)
		case n == 0:
			// Redis counted fewer holds than the owner has (a command run
			// twice) and freed the lock: the owner lost its exclusion. The
			// loss ends a cohort, as any loss does.
			c.WD.Lose(&l.Lease, errCountBehind)
			n = -1
		}
		if n < 0 {
			c.forgetHold(hk, l)
			m.slot.TakeIf(l)
			return r.h.SettleRelease(op, l, n, nil, false)
		}
		return r.h.SettleRelease(op, l, l.Count-1, nil, false) // the Core's count
	}
	m.slot.TakeIf(l)
	err := m.Release(ctx, l, op) // (uncounted: it frees the lock)
	if c.WD.IsHeld(&l.Lease) {
		m.slot.Restore(l) // the release failed: Unlock may retry
	} else {
		c.forgetHold(hk, l)
	}
	return err
}

// HoldCount returns how many holds owner has: the Core's count, while
// Redis names the owner's grant as the holder (the read also checks the
// key's kind); else 0.
func (r *Reentrant) HoldCount(ctx context.Context, owner string) (int, error) {
	c := r.h.C
	hk := HoldKey(r.h.Key, owner)
	defer c.gate(hk)() // (so that no Unlock and Lock of the owner fall between the read and the look)
	st, err := r.x.State(ctx)
	if err != nil {
		return 0, r.h.Fail("holdcount", err)
	}
	if l := c.heldLease(hk); l != nil && st.Holder == l.Spec.ID && c.WD.IsHeld(&l.Lease) {
		return int(l.Count), nil
	}
	return 0, nil
}

// Hold returns the hold the Core records for owner, or nil.
func (r *Reentrant) Hold(owner string) *lease.Hold { return r.h.C.heldLease(HoldKey(r.h.Key, owner)) }
