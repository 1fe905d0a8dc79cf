package dlock

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/internal/engine"
	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/lease"
	"github.com/dlock-go/dlock/internal/scripts"
	"github.com/dlock-go/dlock/internal/telemetry"
	"github.com/dlock-go/dlock/internal/wait"
	"github.com/dlock-go/dlock/internal/wire"
)

// Semaphore is a distributed counting semaphore whose permits are leases.
// Acquire hands out a Permit for n permits; the watchdog renews it while it
// is held (or it expires after WithPermitLease), so a crashed holder's
// permits come back when its lease runs out, measured on the Redis server's
// clock. A Permit has the same lost signal as a lock, and a fencing token.
//
// Waiters are served in arrival order, across all Clients: a request may
// take permits only if the free ones also cover every request queued ahead
// of it. A large request is therefore never starved by a stream of small
// ones; the price is that a small request waits behind a large one even when
// it alone would fit, as with golang.org/x/sync/semaphore. A request for
// more permits than the total waits until the total is raised, but holds
// nobody back meanwhile: it is passed over, as x/sync/semaphore does not
// queue a request it can never serve, and takes its place in arrival order
// again once the total covers it. Permit cohorting (WithPermitCohort, on by
// default) bends arrival order within its bound: a released Permit may go
// to an Acquire of its own Client first.
//
// The total is set with TrySetPermits or SetPermits, and changed with
// AddPermits. It persists in Redis with no expiry, unless WithIdleExpiry
// says otherwise. Make one with Client.Semaphore.
//
// Acquire on a semaphore whose total was never set waits for it to be set,
// as Redisson's does, but leaves nothing without an expiry: the keys it
// writes expire with the waiting marks (a third of the watchdog timeout),
// so a mistyped name, or a waiter that died, leaves nothing behind for
// longer than that. Setting the total (TrySetPermits, SetPermits,
// AddPermits) makes them persist, or follow the idle expiry. The Client
// logs a warning the first time one of its Acquires waits on an unset
// total, once per name; TryAcquire on it, and an Acquire whose ctx ends
// while it is unset, fail with an error that says the total was never set.
type Semaphore struct {
	h      *engine.Handle // keys: M, H, C, Q, QE (see internal/scripts/sem_common.lua) and the channel
	idle   time.Duration
	cohort engine.CohortBound // permit cohorting (WithPermitCohort); zero: off
	ck     string             // the key its permit cohorts are known by in the wait registry
	chains *permitChains      // its Client's
}

// MaxPermits is the largest permit count a Semaphore takes or holds: the
// largest total, the largest request, and the largest count a
// CountDownLatch is set to. Lua numbers are doubles; counts beyond it are
// not exact. Calls that pass a count beyond it, or an AddPermits that would
// take the total beyond it, fail with an error wrapping ErrInvalid and
// change nothing.
const MaxPermits = 1<<53 - 1

// Semaphore returns a handle on the semaphore called name. It sends nothing
// to Redis. An empty name or an invalid option makes every method return an
// error wrapping ErrInvalid.
func (c *Client) Semaphore(name string, opts ...SemaphoreOption) *Semaphore {
	sc := buildSemConfig(opts, SemaphoreOption.applySemaphore)
	h := c.core.NewHandle(telemetry.KindSemaphore, name, sc.lease, sc.renewed, sc.err, ":h", ":c", ":q", ":qe")
	// (ck is no key in Redis: a Mutex cohort on the name, should there be
	// one, looks for waiters by the main key.)
	if h.C.Cfg.Sync.Replicas > 0 {
		// A handed Permit's token would be issued without a WAIT: every
		// Permit comes from a grant in Redis.
		sc.cohort = engine.CohortBound{}
	}
	return &Semaphore{h: h, idle: sc.idle, cohort: sc.cohort, ck: h.Key + ":permits", chains: &c.chains}
}

// Name returns the semaphore's name, without the key prefix.
func (s *Semaphore) Name() string { return s.h.Name }

// TrySetPermits sets the total number of permits to n if it was never set,
// and reports whether it did. n must be between 1 and MaxPermits. A total
// set with an idle expiry (WithIdleExpiry) goes with the semaphore's other
// keys when nobody has used it for that long.
func (s *Semaphore) TrySetPermits(ctx context.Context, n int) (bool, error) {
	if err := s.checkTotal(ctx, n); err != nil {
		return false, err
	}
	return s.permits(ctx, "set", n)
}

// SetPermits sets the total number of permits to n, whatever it was. As with
// AddPermits, permits in use are not revoked, and waiters the new total can
// serve are woken.
func (s *Semaphore) SetPermits(ctx context.Context, n int) error {
	if err := s.checkTotal(ctx, n); err != nil {
		return err
	}
	_, err := s.permits(ctx, "force", n)
	return err
}

func (s *Semaphore) checkTotal(ctx context.Context, n int) error {
	if err := s.h.Usable(ctx); err != nil {
		return err
	}
	if n < 1 || int64(n) > MaxPermits {
		return errs.Invalidf("semaphore %q: a total of %d permits, not between 1 and MaxPermits (%d)", s.h.Name, n, int64(MaxPermits))
	}
	return nil
}

// AddPermits adds n permits to the total; a negative n removes them. It
// fails with ErrInvalid, changing nothing, when the total would drop below
// zero or rise above MaxPermits. Permits in use are not revoked: lowering
// the total below them makes Available negative until enough are released.
// Waiters the new permits can serve are woken.
func (s *Semaphore) AddPermits(ctx context.Context, n int) error {
	if err := s.h.Usable(ctx); err != nil {
		return err
	}
	if int64(n) > MaxPermits || int64(n) < -MaxPermits {
		return errs.Invalidf("semaphore %q: adding %d permits, beyond MaxPermits (%d) either way", s.h.Name, n, int64(MaxPermits))
	}
	_, err := s.permits(ctx, "add", n)
	return err
}

func (s *Semaphore) permits(ctx context.Context, op string, n int) (bool, error) {
	res, err := s.h.C.Script(ctx, scripts.SemPermits, s.h.Keys, op, n, s.h.C.ID, wire.Millis(s.idle)).Slice()
	if err != nil {
		return false, s.h.Fail("permits", err)
	}
	changed, msg, err := wire.DecodePair(res)
	if err != nil {
		return false, errs.Op("permits", s.h.Name, "", err)
	}
	s.endCohorts() // a handoff must not outrun a lowered total
	s.h.WakeLocal(msg)
	return changed == 1, nil
}

// Available returns the number of free permits: the total less the permits
// held by live leases. Expired leases count as free. It is negative after
// AddPermits lowered the total below the permits in use.
func (s *Semaphore) Available(ctx context.Context) (int, error) {
	avail, _, err := s.counts(ctx)
	return avail, err
}

// Total returns the total number of permits, 0 when it was never set.
func (s *Semaphore) Total(ctx context.Context) (int, error) {
	_, total, err := s.counts(ctx)
	return max(total, 0), err
}

func (s *Semaphore) counts(ctx context.Context) (avail, total int, err error) {
	if err := s.h.Usable(ctx); err != nil {
		return 0, 0, err
	}
	res, err := s.h.C.Script(ctx, scripts.SemAvailable, s.h.Keys, s.h.C.ID).Slice()
	if err != nil {
		return 0, 0, s.h.Fail("available", err)
	}
	if len(res) < 2 {
		return 0, 0, errs.Op("available", s.h.Name, fmt.Sprintf("unexpected reply %v", res))
	}
	a, _ := res[0].(int64)
	t, _ := res[1].(int64)
	return int(a), int(t), nil
}

// Acquire blocks until it holds n permits, ctx ends, or the Client closes,
// and returns them as a Permit to Release. Requests are served in arrival
// order (see Semaphore); a request for more than the total waits until the
// total is raised, holding nobody back meanwhile. Acquire(ctx, 0) returns a
// Permit of no permits at once, without asking Redis. When ctx ends first
// it returns an error matching both ErrNotObtained and ctx.Err(), leaves
// the queue, and takes nothing; the error says so when the total was never
// set (see Semaphore).
func (s *Semaphore) Acquire(ctx context.Context, n int) (p *Permit, err error) {
	ctx, sp, err := s.h.BeginAcquire(ctx, "dlock.Semaphore.Acquire", "acquire")
	defer func() { sp.EndAcquire(err, err == nil, true) }()
	if err == nil {
		p, _, err = s.acquire(ctx, n, "acquire", true)
	}
	return p, err
}

// TryAcquire takes n permits if they are free and nobody is queued ahead,
// in one round trip. When they are not (or n exceeds the total, or the
// total was never set, which the error then says), it returns an error
// matching ErrNotObtained. TryAcquire(ctx, 0) succeeds at once.
func (s *Semaphore) TryAcquire(ctx context.Context, n int) (p *Permit, err error) {
	ctx, sp, err := s.h.BeginAcquire(ctx, "dlock.Semaphore.TryAcquire", "tryacquire")
	defer func() { sp.EndAcquire(err, p != nil, false) }()
	unset := false
	if err == nil {
		p, unset, err = s.acquire(ctx, n, "tryacquire", false)
	}
	if err == nil && p == nil {
		detail := fmt.Sprintf("%d permits", n)
		if unset {
			detail += ": " + unsetHint
		}
		err = errs.Op("tryacquire", s.h.Name, detail, ErrNotObtained)
	}
	return p, err
}

// acquire takes n permits; unset reports that its last try found the total
// never set.
func (s *Semaphore) acquire(ctx context.Context, n int, op string, block bool) (p *Permit, unset bool, err error) {
	switch {
	case n < 0 || int64(n) > MaxPermits:
		return nil, false, errs.Invalidf("semaphore %q: acquire %d permits, not between 0 and MaxPermits (%d)", s.h.Name, n, int64(MaxPermits))
	case n == 0:
		return &Permit{s: s, done: true}, false, nil
	}
	t := &semTry{s: s, id: wire.PermitID(s.h.C.ID), n: n}
	as := wait.As{ID: t.id}
	if ttl, renew := s.h.Terms(); block && s.cohort.Max > 0 && renew {
		// A Permit's Release may hand it to t (passLocal). While a cohort
		// of the Client that could runs, t waits for that only, with no
		// place in Redis, until the cohort ends (whose release queues t in
		// Redis) or for the time bound at most; but only beside another
		// Acquire of the Client for as many permits: the permits are most
		// likely all taken then (else a try would take free ones at once).
		runs := func() bool { return s.chains.runs(s.ck, n, ttl) }
		as.Cohort, as.Place = t, t.id
		as.Local = runs() && s.h.C.Waits.AnyCohort(s.h.Channel, s.ck, func(c wait.Cohort) bool {
			o, ok := c.(*semTry)
			return ok && o.n == n && o.ttl() == ttl
		})
		as.LocalFor, as.CohortRuns = s.cohort.MaxTime, runs
	}
	a := s.h.NewAcquisition(ctx, t, op, block, as)
	if as.Local {
		a.As.Queued = func(at time.Time) error {
			a.Sent = at
			_, _, err := a.Refused("", 0, true, false, s.h.Keys[4], []string{s.h.Keys[3], s.h.Keys[0]}, wire.Spec{Kind: wire.SpecMemberWith2, ID: t.id})
			return err
		}
	}
	// A release grants queued requests their permits (sem_release.lua).
	a.As.Handed = func(token uint64) (bool, error) {
		if !t.claim(a.Ctx) {
			return false, nil // handed a Permit locally: the wait takes it
		}
		ok, err := a.TakeHanded(token, func(token uint64) error { return t.keep(a, token) })
		if !ok {
			t.state.Store(tryIdle)
		}
		return ok, err
	}
	if _, err := a.Run(); err != nil {
		if t.unset && errors.Is(err, ErrNotObtained) && ctx.Err() != nil {
			err = errs.Op(op, s.h.Name, unsetHint, ErrNotObtained, ctx.Err())
		}
		return nil, t.unset, err
	}
	return t.p, t.unset, nil
}

// unsetHint ends the error of a call that gave up on a semaphore whose total
// was never set: most likely a mistyped name, or a missing TrySetPermits.
const unsetHint = "the total was never set: call TrySetPermits"

// warnUnset logs, once per Client and name, that an Acquire waits on a
// semaphore whose total was never set.
func (s *Semaphore) warnUnset() {
	if c := s.h.C; c.FirstTime("unset semaphore\x00" + s.h.Name) {
		c.Cfg.Logger.Warn("dlock: Acquire waits on a semaphore whose total was never set; call TrySetPermits",
			"name", s.h.Name, "key", s.h.Key)
	}
}

// Drain takes every permit that is free right now, unless callers are
// queued (they come first; a request for more than the total does not
// count), and returns them as one Permit, of no permits when there are none
// to take. One round trip.
func (s *Semaphore) Drain(ctx context.Context) (p *Permit, err error) {
	ctx, sp, err := s.h.BeginAcquire(ctx, "dlock.Semaphore.Drain", "drain")
	defer func() { sp.EndAcquire(err, err == nil, false) }()
	if err != nil {
		return nil, err
	}
	t := &semTry{s: s, id: wire.PermitID(s.h.C.ID)}
	a := s.h.NewAcquisition(ctx, t, "drain", false, wait.As{ID: t.id})
	a.Sent = time.Now()
	res, err := s.h.C.Script(a.TryCtx(), scripts.SemDrain, s.h.Keys, t.id, wire.Millis(a.TTL), s.h.C.ID).Slice()
	var r wire.Try
	if err == nil {
		r, err = wire.DecodeTry(res)
	}
	if err != nil {
		if errs.OutcomeUnknown(err) {
			// The script may have run: give back what it may have taken,
			// as semTry.try does, rather than leave every free permit
			// taken, unrenewed, for a whole lease.
			_, _ = s.release(a.NC, t.id)
		}
		return nil, s.h.Fail("drain", err)
	}
	if !r.Held {
		return &Permit{s: s, done: true}, nil
	}
	t.n = int(r.Count)
	if _, _, err := a.Granted(func() error { return t.keep(a, r.Token) }); err != nil {
		return nil, err
	}
	return t.p, nil
}

// Delete deletes the semaphore: its total, its permits and its queue. It
// reports whether there was anything to delete. Permits held elsewhere are
// reported lost at their next renewal; waiters are woken and, finding no
// total, wait for one to be set.
func (s *Semaphore) Delete(ctx context.Context) (deleted bool, err error) {
	ctx, sp, err := s.h.Begin(ctx, "dlock.Semaphore.Delete")
	defer func() { sp.EndOther(err) }()
	if err != nil {
		return false, err
	}
	n, err := s.h.C.Script(engine.Detach(ctx), scripts.SemDelete, s.h.Keys, s.h.C.ID).Int()
	if err != nil {
		return false, s.h.Fail("delete", err)
	}
	s.endCohorts() // the deleted permits are not handed on
	s.h.C.Waits.Wake(s.h.Channel, wire.WakeAll, wait.WakeLocal)
	return n == 1, nil
}

// semTry is one Acquire or TryAcquire call: the acquirer of its acquisition.
// Its permit ID is fresh; while it waits it is also its place in the queue.
// An Acquire's is also a wait.Cohort: another Permit's Release may hand it
// that Permit (passLocal).
type semTry struct {
	s     *Semaphore
	id    string
	n     int
	p     *Permit       // once granted
	unset bool          // the last try found the total never set
	state atomic.Int32  // tryIdle, tryRedis, tryLocal or tryEnding
	ended chan struct{} // made before state turns tryEnding; closed once it is over
}

// A semTry's state: a grant from Redis (a try's, or a release's message)
// and a local handoff (passLocal) exclude each other, since permits, unlike
// a lock, can be granted in Redis while a cohort of the Client runs.
const (
	tryIdle   = iota // neither under way
	tryRedis         // a try, or the taking of a handed grant, is under way, or took the permits
	tryLocal         // a Permit was handed to it locally
	tryEnding        // the release that ends the permit cohort it waited for queues it in Redis
)

// ttl is the lease of the Permits t's handle takes.
func (t *semTry) ttl() time.Duration {
	ttl, _ := t.s.h.Terms()
	return ttl
}

// claim takes t for a grant from Redis (a try, or a grant message): false
// when a local handoff has handed t a Permit (its wake-up follows), or ctx
// ended. A handoff claims t under the wait registry's lock and lets it go
// again if it fails: claim waits that out before it reports false. While
// the release that ends a cohort queues t, claim waits for its reply: a try
// before it could take free permits the release would then queue t for
// again.
func (t *semTry) claim(ctx context.Context) bool {
	if t.state.CompareAndSwap(tryIdle, tryRedis) {
		return true
	}
	if t.state.Load() == tryEnding {
		select {
		case <-t.ended:
		case <-ctx.Done():
			return false // the wait ends with ctx; the release's queueing of t is undone (WakeEnded's gone)
		}
	} else {
		t.s.h.C.Waits.Settle()
	}
	return t.state.CompareAndSwap(tryIdle, tryRedis)
}

func (t *semTry) Try(a *engine.Acquisition) (bool, time.Duration, error) {
	if !t.claim(a.Ctx) {
		return false, 0, nil // handed a Permit locally: the wait's wake-up follows
	}
	ok, left, err := t.try(a)
	if !ok {
		t.state.Store(tryIdle)
	}
	return ok, left, err
}

func (t *semTry) try(a *engine.Acquisition) (bool, time.Duration, error) {
	s := t.s
	markTTL := a.Sending()
	res, err := s.h.C.Script(a.TryCtx(), scripts.SemTry, s.h.Keys, t.id, t.n, wire.Millis(a.TTL), wire.Millis(markTTL), s.h.C.ID).Slice()
	var r wire.Try
	if err == nil {
		r, err = wire.DecodeTry(res)
	}
	if err != nil {
		if errs.OutcomeUnknown(err) {
			// The permit ID is unique to this request: giving it back is
			// safe whether or not the lost reply had granted it.
			t.GiveBack(a)
		}
		return false, 0, s.h.Fail(a.Op, err)
	}
	if !r.Held {
		t.unset = r.Unset
		if t.unset && a.Block {
			s.warnUnset()
		}
		return a.Refused("", r.Left, markTTL > 0, r.Queued, s.h.Keys[4], []string{s.h.Keys[3], s.h.Keys[0]}, wire.Spec{Kind: wire.SpecMemberWith2, ID: t.id})
	}
	return a.Granted(func() error { return t.keep(a, r.Token) })
}

// keep records the granted permit.
func (t *semTry) keep(a *engine.Acquisition, token uint64) error {
	if err := a.Fresh(); err != nil {
		return err
	}
	s := t.s
	telemetry.Annotate(a.Ctx, telemetry.AttrPermits.Int(t.n), telemetry.AttrToken.Int64(int64(token)))
	l := a.NewHold(s.h.Keys[1], wire.Spec{Kind: wire.SpecMemberWith2, ID: t.id})
	l.Extra, l.Token = []string{s.h.Keys[0], s.h.Keys[2]}, token
	t.p = &Permit{s: s, id: t.id, n: t.n, l: l, ttl: l.TTL, token: token, since: time.Now()}
	if err := a.Watch(l); err != nil {
		return err
	}
	if _, renew := s.h.Terms(); renew && s.cohort.Max > 0 {
		// A permit cohort begins: its Release may hand it on (passLocal).
		t.p.chained = true
		s.chains.add(s.ck, t.p)
	}
	return nil
}

// GiveBack releases a grant the caller will not get, and leaves the queue.
func (t *semTry) GiveBack(a *engine.Acquisition) {
	_, _ = t.s.release(a.NC, t.id)
	t.s.cancel(a.NC, t.id)
}

func (t *semTry) Leave(a *engine.Acquisition) { t.s.cancel(a.NC, t.id) }

// CohortKey is what the semaphore's permit cohorts are known by in the
// wait registry: with Abandon, what makes t a wait.Cohort.
func (t *semTry) CohortKey() string { return t.s.ck }

// Abandon releases a Permit handed to t locally that its Acquire gave up
// before it took it (its ctx ended, or the Client closed).
func (t *semTry) Abandon(*lease.Hold) { _ = t.p.Release(context.Background()) }

// release returns the permits of id, which go to the requests they serve,
// and wakes those of them waiting on this Client. It returns how many
// permits it returned, -1 when id held none. When id held permits, the
// requests of enqueue (the local waiters of a permit cohort that ends, as
// request ID, permits needed and mark lease in ms) are queued first, in
// their order.
func (s *Semaphore) release(ctx context.Context, id string, enqueue ...any) (int64, error) {
	res, err := s.h.C.Script(ctx, scripts.SemRelease, s.h.Keys, append([]any{id, s.h.C.ID}, enqueue...)...).Slice()
	if err != nil {
		s.h.WakeUnknown(err)
		return 0, s.h.Fail("release", err)
	}
	n, msgs, err := wire.DecodeCountMessages(res)
	if err != nil {
		return 0, errs.Op("release", s.h.Name, "", err)
	}
	for _, msg := range msgs {
		s.h.WakeLocal(msg)
	}
	return n, nil
}

// cancel takes waiter id out of the queue. Best effort: a place left behind
// is dropped when its waiting mark runs out.
func (s *Semaphore) cancel(ctx context.Context, id string) {
	msg, err := s.h.C.Script(engine.Detach(ctx), scripts.SemCancel, s.h.Keys, id, s.h.C.ID).Text()
	if err != nil {
		s.h.WakeUnknown(err)
		return
	}
	s.h.WakeLocal(msg)
}
