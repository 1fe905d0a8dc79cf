package engine

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"time"

	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/lease"
	"github.com/dlock-go/dlock/internal/telemetry"
	"github.com/dlock-go/dlock/internal/wait"
	"github.com/dlock-go/dlock/internal/wire"
)

// Lock cohorting (WithCohort): a Mutex handle that holds the lock, while
// goroutines of its Client wait for the same name (on this handle or on any
// other cohorting Mutex handle of the name), hands the hold to the first of
// them without a round trip to Redis, up to its bound, and only then
// releases to the queue in Redis. Any handle, so that the common
// c.Mutex(name).Lock per call cohorts as a shared handle does.
//
// A Lock on any cohorting handle of the name while a cohort of its Client
// runs (the wait registry records where, while its Client has waiters for
// the name) waits for a local handoff only
// (wait.As.Local), without a round trip: it has no place in the queue in
// Redis. If the cohort ends first, the Unlock that releases to Redis queues
// it there in the same script, in local arrival order, and wakes it to start
// its waiting mark (wait.WakeQueued); after the cohort's time bound at the latest
// it tries and queues on its own. It looks again once it has joined the
// registry (cohortRuns), and tries at once if the cohort ended in
// between: that cohort's release found no such waiter to queue. A cohort
// hold that is lost ends the cohort as well (Core.cohortLost): its local
// waiters try at once. Other waiters wait as every Mutex waiter does,
// queued in Redis.
//
// A local handoff picks the first cohorting waiter of the name in this
// Client's registry (arrival order), makes it a new hold of its own on the
// same Redis hold (same holder ID, same lease deadline, the next token of
// the block the Redis grant reserved) on the waiter's handle, and wakes it
// with wait.WakeCohort. If the waiter had a place in the queue in Redis, the
// place stays there, unclaimed behind the cohort's hold, and joins the
// hold's Served: the Unlock that finally releases to Redis drops every place
// the cohort served before it hands the lock on, and a cohort that ends
// otherwise (its hold lost, or handed over) drops them in the background
// (DropServed). Nothing is sent while the cohort runs. The bounds that
// apply are those of the handle that passes the hold on.
//
// Past the time bound, a hold is still handed on locally (within the
// handoff bound and its reserved tokens) when nobody else waits: its Redis
// grant was quiet (excl_try's hot path: nobody had queued since the lock
// was last free), the Core's hub has been subscribed to the lock's channel
// without a break since before that try was sent, and no announcement
// ('q', see excl_try) has arrived on it since: the first waiter to queue
// since a quiet grant that this Client's cohort would not serve (one of
// another Client, or of a handle WithoutCohort) announces itself.

// CohortBound is how far a Mutex WithCohort hands its hold on locally.
type CohortBound struct {
	Max     int           // local handoffs per Redis grant; 0: off
	MaxTime time.Duration // since the Redis grant
}

// cohortOn reports whether m hands its holds on locally: a Mutex, a
// ReentrantMutex or an RWMutex's writers (not an Election's lock), with a
// bound and no fixed lease.
func (m *Mutex) cohortOn() bool {
	return m.cohort.Max > 0 && m.h.Lease == 0 && cohortKind(m.h.Kind)
}

// cohortKind reports whether locks of kind cohort: a Mutex, a
// ReentrantMutex and an RWMutex's writers.
func cohortKind(kind string) bool {
	return kind == telemetry.KindMutex || kind == telemetry.KindReentrant || kind == telemetry.KindRWWrite
}

// reads reports whether owner holds a read hold of m's lock, an RWMutex's,
// on this Core: a write hold of an owner that reads (it downgraded) must
// not pass to another owner, nor one to an owner that reads (it would
// upgrade), locally; the release in Redis sees the read hold.
func (m *Mutex) reads(owner string) bool {
	if m.x.s != exclRWWrite || owner == "" {
		return false
	}
	c := m.h.C
	l := c.heldLease(HoldKey(m.h.Keys[1], owner)) // (the read side's hold key: RL's)
	return l != nil && c.WD.IsHeld(&l.Lease)
}

// passLocal hands l, just taken out of the slot by Unlock, to the first
// goroutine of the Core waiting on a cohorting handle of the name, within
// the bound (past the time bound when nobody else waits). It reports false
// when it handed nothing: l is then still the caller's to release. An error
// says that the hold it handed on turned out forced (see isForced): the
// Unlock returns it. A served waiter's place in the queue in Redis, if it
// had one, joins the cohort's Served, which the release that ends the
// cohort drops (see the top of this file).
func (m *Mutex) passLocal(l *lease.Hold) (bool, error) {
	co := l.Cohort
	if co.End == 0 || co.N >= m.cohort.Max || l.Token >= co.End {
		return false, nil
	}
	if time.Since(co.Since) >= m.cohort.MaxTime && !m.nobodyElseWaits(co) {
		return false, nil
	}
	c := m.h.C
	if m.reads(m.owner) {
		return false, nil
	}
	if c.isForced(l) {
		// A ForceUnlock took it (forceNotice): the caller's release
		// finds it gone.
		c.WD.Lose(&l.Lease, errForced)
		return false, nil
	}
	var to *Slot
	var given *lease.Hold
	w := c.Waits.PickCohort(m.h.Channel, m.h.Key, func(w *wait.Waiter) (*lease.Hold, bool) {
		wm := w.Cohort().(*Mutex) // the waiter's handle's engine: m, or another of the name
		if wm.h.Kind != m.h.Kind || wm.reads(wm.owner) {
			// Locks of two kinds on one name (each fails on the other's
			// key), or an RWMutex writer whose owner reads.
			return nil, false
		}
		nl := lease.NewHold(context.Background(), wm.h.Name, wm.h.Kind, l.Key, l.Spec, l.TTL, true, l.Start)
		nl.Token = l.Token + 1
		nl.Cohort = lease.CohortState{Grant: co.Grant, End: co.End, N: co.N + 1, Since: co.Since, Served: co.Served, Quiet: co.Quiet}
		if !w.Local() { // it tried in Redis, so it may be queued there
			nl.Cohort.Served = append(slices.Clip(co.Served), w.Place())
		}
		if !c.WD.Pass(&l.Lease, &nl.Lease) {
			return nil, false
		}
		// As keep does; an older hold of the handle cannot be there while
		// l held the lock.
		wm.slot.Put(nl, c.WD)
		to, given = wm.slot, nl
		return nl, false
	})
	if w == nil {
		return false, nil
	}
	c.Waits.SetCohort(m.h.Channel, m.h.Key, to)
	if c.isForced(given) {
		// A ForceUnlock's notice came while the hold changed slots: the
		// notice's look at the record may have missed it (forceNotice
		// marks before it looks; this looks after the record moved). The
		// new holder learns from its Lost, the caller from its Unlock.
		c.WD.Lose(&given.Lease, errForced)
		return true, errs.Op("unlock", m.h.Name, "", errForced)
	}
	runtime.Gosched() // let the new holder run, as handedTo does
	return true, nil
}

// cohortRuns reports whether a hold of m's lock on this Core is in a
// cohort, on m's handle or on another: a Lock then waits for a local
// handoff only (see the top of this file). A Lock asks before it waits,
// and again once it has joined the registry (wait.As.CohortRuns). A cohort
// found on m's own handle is recorded for the lock's name (SetCohort, which
// records only while waiters exist, so at the second look), so that Locks
// on other handles and a ForceUnlock's notice (forceNotice) find its hold.
func (m *Mutex) cohortRuns() bool {
	c := m.h.C
	if m.slot.inLiveCohort(c.WD) {
		c.Waits.SetCohort(m.h.Channel, m.h.Key, m.slot)
		return true
	}
	s, _ := c.Waits.CohortAt(m.h.Channel, m.h.Key).(*Slot)
	return s != nil && s.inLiveCohort(c.WD)
}

// cohortLost ends the cohort of l, a Mutex hold just lost: the goroutines
// of this Core waiting for a local handoff of the lock try in Redis now,
// rather than at their handle's time bound.
//
// It runs on a goroutine of its own: the loss may be reported on a
// goroutine that holds the registry's lock (a local handoff's Slot.Put
// ends the slot's older hold).
func (c *Core) cohortLost(l *lease.Hold) {
	c.Background(func(ctx context.Context) {
		channel := wire.ChannelOf(l.Key)
		s, _ := c.Waits.CohortAt(channel, l.Key).(*Slot)
		if h := s.get(); h == nil || h.Spec.ID == l.Spec.ID || !c.WD.IsHeld(&h.Lease) {
			// (Else a newer cohort runs, and its waiters wait for it.)
			ws, _ := c.Waits.EndCohort(channel, l.Key, nil)
			c.Waits.WakeEnded(ws, false, time.Time{})
		}
		c.dropServed(ctx, l)
	})
}

// DropServed takes the places in Redis of the waiters a cohort served out
// of the queue, in the background, for a cohort that ends without a
// release of its own (lost, or handed over): that release would have
// dropped them (see the top of this file). A place that a grant reached
// meanwhile passes the lock on. Should Redis be out of reach, each place
// goes when its waiting mark runs out (its waiter stopped renewing it when
// it was served).
func (c *Core) DropServed(l *lease.Hold) {
	if len(l.Cohort.Served) > 0 {
		c.Background(func(ctx context.Context) { c.dropServed(ctx, l) })
	}
}

func (c *Core) dropServed(ctx context.Context, l *lease.Hold) {
	if len(l.Cohort.Served) == 0 || !cohortKind(l.Kind) {
		return
	}
	var x *Excl
	if l.Kind == telemetry.KindRWWrite {
		x = NewRWWriteExcl(c.NewHandle(l.Kind, l.Name, 0, 0, nil, RWKeys...), false)
	} else {
		x = NewExcl(c.NewHandle(l.Kind, l.Name, 0, 0, nil, ExclKeys...), l.Kind == telemetry.KindReentrant)
	}
	for _, p := range l.Cohort.Served {
		x.Cancel(ctx, p)
	}
}

// errForced is why a hold that a ForceUnlock took is lost, as its
// notice tells (forceNotice).
var errForced = fmt.Errorf("%w: force-unlocked", errs.ErrLost)

// forcedMark is what a ForceUnlock's notice said of a grant of a lock
// (forceNotice): its token, and when the notice came.
type forcedMark struct {
	token uint64
	at    time.Time
}

// markForced records that a ForceUnlock took the grant id (token) of the
// lock key, for as long as a cohort of this Core could still hand a hold
// of that grant on: until its next renewal finds it gone, within the
// longest lease the Core renews.
func (c *Core) markForced(key, id string, token uint64) {
	now := time.Now()
	keep := max(c.Cfg.Watchdog, time.Duration(c.maxRenewed.Load()))
	c.forced.Range(func(k, v any) bool {
		if now.Sub(v.(forcedMark).at) > keep {
			c.forced.Delete(k)
		}
		return true
	})
	c.forced.Store(HoldKey(key, id), forcedMark{token: token, at: now})
	n := int32(0)
	c.forced.Range(func(any, any) bool { n++; return true })
	c.forcedMarks.Store(n) // after the mark: see forceNotice for the order
}

// isForced reports whether l comes from a grant that a ForceUnlock's
// notice named (markForced): its ID with its token, or, for a cohort's
// local hold, with the token of the Redis grant it comes from.
func (c *Core) isForced(l *lease.Hold) bool {
	if l == nil || c.forcedMarks.Load() == 0 {
		return false // (no lookup on a local handoff while no mark is kept)
	}
	v, ok := c.forced.Load(HoldKey(l.Key, l.Spec.ID))
	if !ok {
		return false
	}
	t := v.(forcedMark).token
	return t == l.Token || l.Cohort.End > 0 && t == l.Cohort.Grant
}

// nobodyElseWaits reports whether, as far as the Core can tell, nobody its
// cohort would not serve has queued for the lock since the quiet Redis
// grant of co (see the top of this file).
func (m *Mutex) nobodyElseWaits(co lease.CohortState) bool {
	hub := m.h.C.hub
	return !co.Quiet.IsZero() && hub != nil && hub.Quiet(m.h.Channel, co.Quiet)
}

// CohortKey is the key of m's lock: with Abandon, what makes m a
// wait.Cohort.
func (m *Mutex) CohortKey() string { return m.h.Key }

// Abandon releases a hold handed to a waiter that gave up (its ctx ended,
// or the Client closed) before it took it.
func (m *Mutex) Abandon(g *lease.Hold) {
	if m.slot.TakeIf(g) { // else another goroutine unlocked it already
		_ = m.Release(context.Background(), g, "unlock")
	}
}
