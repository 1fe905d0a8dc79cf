package dlock

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/dlock-go/dlock/internal/engine"
	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/lease"
	"github.com/dlock-go/dlock/internal/scripts"
	"github.com/dlock-go/dlock/internal/telemetry"
	"github.com/dlock-go/dlock/internal/wait"
	"github.com/dlock-go/dlock/internal/wire"
)

// Permit is a grant of permits from a Semaphore: a lease, renewed by the
// watchdog unless WithPermitLease fixed it. Release it exactly once. A
// Permit's methods are safe for concurrent use. A Permit of no permits
// (from Acquire(ctx, 0), or a Drain that found none) holds nothing in Redis.
type Permit struct {
	s  *Semaphore
	id string // the Redis grant it holds on: its own, or a cohort's
	n  int
	l  *lease.Hold // nil for a Permit of no permits
	// The lease it was granted on (l.TTL, which Extend changes): what an
	// Acquire it may be handed to must take.
	ttl time.Duration

	// Its fencing token. A Permit handed on locally gets its token from a
	// script sent as it is handed on (issue); until the reply, issued is
	// open and token unset.
	token  uint64
	issued chan struct{} // nil once the token is known at the start
	// Its place in a permit cohort (passLocal): whether it is in one (it
	// is recorded in its Client's permitChains), the local handoffs since
	// the Redis grant, and when this Client took that grant.
	chained bool
	passes  int
	since   time.Time

	mu   sync.Mutex
	done bool // Release succeeded, or found the permit gone
}

// Count returns how many permits p holds.
func (p *Permit) Count() int { return p.n }

// Token returns the permit's fencing token: strictly greater than the token
// of every permit taken earlier from the same semaphore. A Permit of no
// permits has none (0). A Permit handed on within its Client
// (WithPermitCohort) is given its token by a round trip that starts as it
// is handed on: Token waits for that reply, and returns 0 when the reply
// says the permits were gone by then (Lost fires) or never comes (Redis out
// of reach; the Client's command timeouts bound the wait). Every fencing
// guard refuses 0.
func (p *Permit) Token() uint64 {
	if p.l == nil {
		return 0
	}
	if p.issued != nil {
		<-p.issued
	}
	return p.token
}

// Release gives the permits back and wakes the waiters they can serve. A
// second Release, or one after the lease expired, returns an error matching
// ErrNotHeld (and ErrLost, when the lease ran out) and changes no count.
// Like Mutex.Unlock, it runs even when ctx has ended, it returns nil when
// Redis released the permits although Lost fired on the way, and when it
// fails the permit is no longer renewed: it ends by its lease at the
// latest. Releasing
// a Permit of no permits does nothing.
func (p *Permit) Release(ctx context.Context) (err error) {
	if p.l == nil {
		return nil
	}
	s := p.s
	ctx, sp, err := s.h.Begin(ctx, "dlock.Permit.Release")
	defer func() { sp.EndRelease(err) }()
	telemetry.Annotate(ctx, telemetry.AttrPermits.Int(p.n))
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return errs.Op("release", s.h.Name, "", ErrNotHeld)
	}
	if p.issued != nil {
		<-p.issued // its token first: a release must not overtake the issue
	}
	if err := s.h.LostAlready("release", p.l); err != nil {
		p.done = true
		s.endLost(p)
		return err
	}
	if s.passLocal(p) {
		p.done = true
		return nil
	}
	// A cohort that ends queues its local waiters in Redis, in its
	// release's own script: behind those queued already, ahead of the
	// caller's next request. Until the reply they are handed no Permit,
	// and a try of theirs waits for it (tryEnding, semTry.claim): a try
	// could be granted free permits, which the script would then queue the
	// request for once more. Then they are woken to keep their places (or,
	// if the script did not queue them, to try).
	var local []*wait.Waiter
	var enqueue []any
	if p.chained {
		s.chains.remove(s.ck, p) // first: an Acquire from now on tries in Redis
		local, _ = s.h.C.Waits.EndCohort(s.h.Channel, s.ck, func(w *wait.Waiter) {
			t := w.Cohort().(*semTry)
			t.ended = make(chan struct{})
			t.state.Store(tryEnding)
		})
		for _, w := range local {
			t := w.Cohort().(*semTry)
			enqueue = append(enqueue, t.id, t.n, wire.Millis(t.s.h.MarkLease()))
		}
	}
	s.h.BeginRelease(p.l)
	ctx = engine.Detach(ctx)
	sent := time.Now()
	n, err := s.release(ctx, p.id, enqueue...)
	if len(local) > 0 {
		for _, w := range local {
			t := w.Cohort().(*semTry)
			t.state.Store(tryIdle)
			close(t.ended)
		}
		for _, place := range s.h.C.Waits.WakeEnded(local, err == nil && n >= 0, sent) {
			s.cancel(ctx, place) // it gave up meanwhile: its place goes
		}
	}
	if err == nil {
		p.done = true
		n = min(n, 0) // 0: released; -1: held none
	}
	return s.h.SettleRelease("release", p.l, n, err, true)
}

// Extend makes the permit end lease from now (see Mutex.Extend). After
// Release it returns an error matching ErrNotHeld; a Permit of no permits
// has nothing to extend, and Extend does nothing.
func (p *Permit) Extend(ctx context.Context, lease time.Duration) error {
	if p.l == nil {
		return nil
	}
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	l := p.l
	if done {
		l = nil
	}
	return p.s.h.Extend(ctx, "dlock.Permit.Extend", l, lease)
}

// Lost returns a channel that is closed if the permit's lease is lost (it
// expired, renewals failed for a whole lease, or the Client closed). Release
// does not close it. A Permit of no permits returns nil, which never fires.
func (p *Permit) Lost() <-chan struct{} {
	if p.l == nil {
		return nil
	}
	return p.s.h.C.WD.LostOf(p.l)
}

// HoldContext returns a copy of parent that is cancelled when the permit
// ends: by Release, or by loss, in which case context.Cause reports an error
// matching ErrLost. Call the CancelFunc when done. For a Permit of no
// permits, the context is already cancelled, with cause ErrNotHeld.
func (p *Permit) HoldContext(parent context.Context) (context.Context, context.CancelFunc) {
	return p.s.h.C.WD.HoldContext(parent, p.l)
}

// passLocal hands p, which Release is giving back, to the first Acquire of
// the Client waiting for as many permits on the semaphore, within the
// cohort's bound (WithPermitCohort): a new Permit on the same Redis grant,
// with the same lease deadline, whose token the script sem_pass issues in
// the background (issue). It reports false when it handed nothing: p is
// then the caller's to release.
func (s *Semaphore) passLocal(p *Permit) bool {
	c := s.h.C
	if !p.mayPass() || !s.chains.has(s.ck, p) {
		return false
	}
	var np *Permit
	var to *semTry
	w := c.Waits.PickCohort(s.h.Channel, s.ck, func(w *wait.Waiter) (*lease.Hold, bool) {
		t, ok := w.Cohort().(*semTry)
		if !ok || t.n != p.n || t.ttl() != p.ttl {
			// It wants another number of permits, or a lease of
			// another length (WithRenewedPermitLease).
			return nil, true
		}
		if !t.state.CompareAndSwap(tryIdle, tryLocal) {
			return nil, true // it is taking a grant from Redis
		}
		l := p.l
		nl := lease.NewHold(context.Background(), s.h.Name, s.h.Kind, l.Key, l.Spec, p.ttl, true, l.Start)
		nl.Extra = l.Extra
		if !c.WD.Pass(&l.Lease, &nl.Lease) {
			// Extended, lost, fixed, or too little of its lease left.
			t.state.Store(tryIdle)
			return nil, false
		}
		np = &Permit{s: t.s, id: p.id, n: p.n, l: nl, ttl: p.ttl, issued: make(chan struct{}), chained: true, passes: p.passes + 1, since: p.since}
		t.p, to = np, t
		return nl, false
	})
	if w == nil {
		return false
	}
	s.chains.replace(s.ck, p, np)
	if !c.Background(func(ctx context.Context) { s.issue(ctx, np, to.id) }) {
		close(np.issued) // the Client closed: the hold is lost with it
	}
	runtime.Gosched() // let the new holder run, as the Mutex's cohort does
	return true
}

// errPassedGone is why a Permit handed on locally is lost when its permits
// turned out gone from Redis by the time its token was to be issued.
var errPassedGone = fmt.Errorf("%w: the permits were gone when handed on", errs.ErrLost)

// issue runs sem_pass for np, just handed to the Acquire whose request ID is
// waiter: np's token, and waiter's place out of the queue.
func (s *Semaphore) issue(ctx context.Context, np *Permit, waiter string) {
	defer close(np.issued)
	// (Past its lease the Permit is lost whatever the reply: its token
	// is worth no longer a wait.)
	ctx, cancel := context.WithTimeout(ctx, np.ttl)
	defer cancel()
	res, err := s.h.C.Script(ctx, scripts.SemPass, s.h.Keys, np.id, waiter, s.h.C.ID).Slice()
	if err != nil {
		// The token stays 0, which every guard refuses; the renewals
		// tell whether the permits are still held. The served Acquire's
		// place may still be queued, renewed by nobody: it goes, with a
		// grant that reached it (as sem_pass would have done).
		s.h.WakeUnknown(err)
		s.cancel(ctx, waiter)
		return
	}
	token, msgs, err := wire.DecodeCountMessages(res)
	if err != nil {
		return
	}
	for _, msg := range msgs {
		s.h.WakeLocal(msg)
	}
	if token <= 0 {
		s.h.C.WD.Lose(&np.l.Lease, errPassedGone)
		s.endLost(np)
		return
	}
	np.token = uint64(token)
}

// endCohorts ends every permit cohort of the Client on the semaphore, whose
// total was just changed or which was just deleted: their Permits go back
// to Redis on Release, and the Acquires that waited for them try.
func (s *Semaphore) endCohorts() {
	if s.chains.drop(s.ck) {
		s.wakeLocalWaiters()
	}
}

// wakeLocalWaiters wakes the Acquires of the Client that wait for a local
// handoff on the semaphore to try in Redis.
func (s *Semaphore) wakeLocalWaiters() {
	local, _ := s.h.C.Waits.EndCohort(s.h.Channel, s.ck, nil)
	s.h.C.Waits.WakeEnded(local, false, time.Time{})
}

// endLost ends the permit cohort of p, a Permit found lost: the Acquires
// that waited for it to hand them a Permit try in Redis now, rather than at
// their time bound.
func (s *Semaphore) endLost(p *Permit) {
	if !p.chained {
		return
	}
	s.chains.remove(s.ck, p)
	s.wakeLocalWaiters()
}

// mayPass reports whether p's Release may still hand it on locally: it is
// in a permit cohort within its bound, and held.
func (p *Permit) mayPass() bool {
	co := p.s.cohort
	return p.chained && p.passes < co.Max && time.Since(p.since) < co.MaxTime && p.s.h.C.WD.IsHeld(&p.l.Lease)
}

// permitChains records a Client's running permit cohorts: the Permits a
// Release may hand on locally, by semaphore (Semaphore.ck). An Acquire
// that one of them could serve waits for that, without a place in Redis
// (see Semaphore.acquire).
type permitChains struct {
	mu sync.Mutex
	by map[string]map[*Permit]struct{}
}

func (pc *permitChains) add(ck string, p *Permit) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.by == nil {
		pc.by = map[string]map[*Permit]struct{}{}
	}
	if pc.by[ck] == nil {
		pc.by[ck] = map[*Permit]struct{}{}
	}
	pc.by[ck][p] = struct{}{}
}

// replace records np, handed on from p, in p's place.
func (pc *permitChains) replace(ck string, p, np *Permit) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if set := pc.by[ck]; set != nil {
		delete(set, p)
		set[np] = struct{}{}
	}
}

func (pc *permitChains) remove(ck string, p *Permit) {
	if !p.chained {
		return
	}
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if set := pc.by[ck]; set != nil {
		delete(set, p)
		if len(set) == 0 {
			delete(pc.by, ck)
		}
	}
}

// has reports whether p is recorded: in a permit cohort that no change of
// the total ended.
func (pc *permitChains) has(ck string, p *Permit) bool {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	_, ok := pc.by[ck][p]
	return ok
}

// drop forgets every Permit of the semaphore ck, and reports whether there
// was any.
func (pc *permitChains) drop(ck string) bool {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	_, ok := pc.by[ck]
	delete(pc.by, ck)
	return ok
}

// runs reports whether a Permit of n permits of the semaphore ck, on a
// lease of ttl, may still be handed on. (One lost and never released stays
// recorded, and is passed over, until the Client closes.)
func (pc *permitChains) runs(ck string, n int, ttl time.Duration) bool {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	for p := range pc.by[ck] {
		if p.n == n && p.ttl == ttl && p.mayPass() {
			return true
		}
	}
	return false
}
