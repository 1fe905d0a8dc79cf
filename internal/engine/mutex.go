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

// Mutex is the Lock engine of a Mutex on one Redis (or its cluster, or its
// Sentinel deployment): the exclusive lock of excl_*.lua, its queue in
// Redis, and lock cohorting (cohort.go).
type Mutex struct {
	h      *Handle
	x      *Excl
	slot   *Slot
	cohort CohortBound
	// A ReentrantMutex call's (reentrant.go): its owner, and the lock's
	// scripts as a counted kind (re-entry and the Unlocks before the
	// last), where x's release frees the lock whatever Redis counts.
	owner string
	cx    *Excl
}

// NewMutex returns the engine of the Mutex whose handle is h (made with
// ExclKeys) and whose current hold is in slot.
func NewMutex(h *Handle, slot *Slot, cohort CohortBound) *Mutex {
	return &Mutex{h: h, x: NewExcl(h, false), slot: slot, cohort: cohort}
}

// HandsOver is true: a hold on one Redis can be released or extended by
// its holder ID from any process.
func (m *Mutex) HandsOver() bool { return true }

// Acquire runs one Lock or TryLock call.
func (m *Mutex) Acquire(ctx context.Context, op string, block bool) (bool, error) {
	a, _ := m.acquisition(ctx, op, block)
	return a.Run()
}

// mutexTry is one Lock or TryLock call of a Mutex: the Acquirer of its
// acquisition. Each call holds under a fresh ID.
type mutexTry struct {
	m       *Mutex
	id      string
	reserve int    // tokens its grant reserves after its own (cohort.go)
	waiter  string // id as it queues: see Excl.waiter
	// A ReentrantMutex call (reentrant.go): the hold it is re-entering
	// (for GiveBack), whether it re-entered its owner's hold, and whether
	// it may have a place in the queue in Redis: it tried with a mark
	// (placed), or waited for a local handoff (local), which the end of a
	// cohort queues.
	reentry   *lease.Hold
	reentered bool
	placed    bool
	local     bool
}

func (m *Mutex) acquisition(ctx context.Context, op string, block bool) (*Acquisition, *mutexTry) {
	// (A ReentrantMutex grant's ID is no longer, with its owner's in it:
	// past 64 bytes a field value makes Redis keep the lock's hash as a
	// hash table rather than a listpack, slower for every script.)
	id := m.h.C.NewToken()
	t := &mutexTry{m: m, id: id}
	if m.cohortOn() {
		t.reserve = m.cohort.Max // the tokens of the local handoffs (cohort.go)
	}
	t.waiter = m.x.waiter(m.h.Lease, t.reserve, id)
	as := wait.As{ID: id, Owner: m.owner}
	if m.x.s == exclRWWrite {
		as.Kind = wire.KindWriter
	}
	if m.cohortOn() {
		as.Cohort, as.Place = m, t.waiter
		as.Local, as.LocalFor = block && m.cohortRuns(), m.cohort.MaxTime
		as.CohortRuns = m.cohortRuns
		if m.owner != "" {
			// An owner that holds now re-enters rather than wait for a
			// handoff (Registry.Took wakes it if it comes later).
			as.CohortRuns = func() bool { return m.cohortRuns() && m.h.C.heldLease(HoldKey(m.h.Key, m.owner)) == nil }
		}
	}
	a := m.h.NewAcquisition(ctx, t, op, block, as)
	t.local = as.Local
	if as.Local {
		a.As.Queued = func(at time.Time) error {
			a.Sent = at
			markKey, markExtra := m.x.markKeys()
			_, _, err := a.Refused("", 0, true, false, markKey, markExtra, wire.Spec{Kind: wire.SpecMemberWith, ID: t.waiter})
			return err
		}
	}
	a.As.Handed = func(token uint64) (bool, error) {
		return a.TakeHanded(token, func(token uint64) error { return t.keep(a, token, false) })
	}
	return a, t
}

func (t *mutexTry) Try(a *Acquisition) (bool, time.Duration, error) {
	m := t.m
	if done, ok, err := t.reenter(a, t.placed || t.local); done {
		return ok, 0, err
	}
	markTTL := a.Sending()
	t.placed = t.placed || markTTL > 0
	r, err := m.x.Try(a.TryCtx(), t.waiter, t.id, t.reserve, a.TTL, markTTL, 0)
	if err != nil {
		return false, 0, t.unknownOutcome(a, err)
	}
	if r.Held {
		return a.Granted(func() error { return t.keep(a, r.Token, r.Quiet) })
	}
	markKey, markExtra := m.x.markKeys()
	return a.Refused(wire.ClientOf(r.Holder), r.Left, markTTL > 0, r.Queued, markKey, markExtra, wire.Spec{Kind: wire.SpecMemberWith, ID: t.waiter})
}

// keep records the granted hold as the handle's; quiet says that the
// grant found nobody queued since the lock was last free.
func (t *mutexTry) keep(a *Acquisition, token uint64, quiet bool) error {
	if err := a.Fresh(); err != nil {
		return err
	}
	m := t.m
	l := a.NewHold(m.h.Key, wire.Spec{Kind: wire.SpecHolder, ID: t.id})
	l.Token = token
	if m.cohortOn() {
		l.Cohort = lease.CohortState{Grant: token, End: token + uint64(m.cohort.Max), Since: time.Now()}
		if quiet {
			l.Cohort.Quiet = a.Sent
		}
	}
	m.slot.Put(l, m.h.C.WD)
	if m.cohortOn() {
		// Locks on other handles may join the cohort (cohortRuns).
		m.h.C.Waits.SetCohort(m.h.Channel, m.h.Key, m.slot)
	}
	if err := a.Watch(l); err != nil {
		m.slot.TakeIf(l)
		return err
	}
	telemetry.Annotate(a.Ctx, telemetry.AttrHoldCount.Int(1), telemetry.AttrToken.Int64(int64(token)))
	return nil
}

func (t *mutexTry) GiveBack(a *Acquisition) {
	if t.reentry != nil {
		// One hold of the owner's grant. Should that fail, Redis counts
		// one more than the Core, which is harmless: the Core's count
		// decides the last Unlock (reentrant.go).
		_, _ = t.m.cx.Unlock(a.NC, t.reentry.Spec.ID)
		return
	}
	if _, err := t.m.x.Unlock(a.NC, t.id); err != nil {
		t.m.x.Cancel(a.NC, t.waiter)
	}
}

func (t *mutexTry) Leave(a *Acquisition) { t.m.x.Cancel(a.NC, t.waiter) }

// unknownOutcome handles an acquisition that failed in transit: Redis may
// have granted it, or queued it, with no reply arriving. The ID is unique to
// this call, so giving back whatever it holds is always safe, and it keeps a
// failed Lock from leaving a hold or a queue entry behind. Local waiters are
// woken to look again.
func (t *mutexTry) unknownOutcome(a *Acquisition, err error) error {
	if errs.OutcomeUnknown(err) {
		t.m.x.Cancel(a.NC, t.waiter)
		_, _ = t.m.x.Unlock(a.NC, t.id)
		// The lost reply may have named a waiter of this Core that the
		// script handed the lock to, which nobody else will wake.
		t.m.h.WakeUnknown(err)
	}
	return t.m.h.Fail(a.Op, err)
}

// Release releases l, which Unlock took out of the slot: to a goroutine
// waiting on a cohorting handle (within the cohort's bound), or in Redis.
func (m *Mutex) Release(ctx context.Context, l *lease.Hold, op string) error {
	c := m.h.C
	if m.cohortOn() {
		if hook := c.Hooks.BeforePassLocal; hook != nil {
			hook()
		}
		if ok, err := m.passLocal(l); ok {
			return err
		}
	}
	var local []*wait.Waiter
	var enqueue []string
	if m.cohortOn() {
		// The cohort ends: its local waiters queue in Redis, behind those
		// of other Clients, in their order, in the release's own script
		// (and so ahead of the caller should it lock again); then they are
		// woken to take their places (cohort.go).
		c.Waits.ClearCohort(m.h.Channel, m.slot)
		local, enqueue = c.Waits.EndCohort(m.h.Channel, m.h.Key, nil)
		if hook := c.Hooks.BeforeCohortRelease; hook != nil && len(local) > 0 {
			hook()
		}
	}
	m.h.BeginRelease(l)
	sent := time.Now()
	remaining, err := m.x.unlockCohort(Detach(ctx), l.Spec.ID, l.Cohort.Served, enqueue)
	if len(local) > 0 {
		// The script queued them only if l still held the lock.
		for _, place := range c.Waits.WakeEnded(local, err == nil && remaining == 0, sent) {
			m.x.Cancel(Detach(ctx), place)
		}
	}
	if err != nil {
		err = m.h.Fail(op, err)
		m.slot.Restore(l)
	}
	return m.h.SettleRelease(op, l, remaining, err, true)
}

// Extend runs Extend for hold l.
func (m *Mutex) Extend(ctx context.Context, spanName string, l *lease.Hold, d time.Duration) error {
	return m.h.Extend(ctx, spanName, l, d)
}

// State reads the lock.
func (m *Mutex) State(ctx context.Context, op string) (ExclState, error) {
	if err := m.h.Usable(ctx); err != nil {
		return ExclState{}, err
	}
	st, err := m.x.State(ctx)
	if err != nil {
		return ExclState{}, m.h.Fail(op, err)
	}
	return st, nil
}

// ForceUnlock releases the lock whoever holds it; the handle's own hold is
// reported lost at once: the one it had when the force was sent. (A hold
// the handle got after the force ran is not the force's: a waiter woken
// by the force's own notice, or by the loss it reports, may hold by then.)
func (m *Mutex) ForceUnlock(ctx context.Context, spanName string) (bool, error) {
	held := m.slot.Get()
	return m.x.ForceUnlock(ctx, spanName, func(cause error) {
		if held != nil {
			m.h.C.WD.Lose(&held.Lease, cause)
		}
	})
}
