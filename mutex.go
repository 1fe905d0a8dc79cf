package dlock

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"fmt"
	"sync"
	"time"

	"github.com/dlock-go/dlock/internal/wait"

	"github.com/dlock-go/dlock/internal/lease"
	"github.com/dlock-go/dlock/internal/telemetry"
	"github.com/dlock-go/dlock/internal/wire"
)

// Mutex is a distributed mutual exclusion lock that behaves like sync.Mutex:
// it is not reentrant, and one handle may be shared by many goroutines, which
// then exclude each other just as goroutines on other handles and in other
// processes do. As with sync.Mutex, the hold belongs to the handle, not to a
// goroutine: any goroutine may Unlock what another locked.
//
// Each acquisition stores a fresh random ID in the lock's key, and Unlock
// releases the lock only if it still holds that ID, so a hold that expired
// can never release someone else's newer hold. Each acquisition also gets a
// fencing token (see Token).
//
// Make one with Client.Mutex. The zero Mutex is not usable.
type Mutex struct {
	handle
	x excl

	mu   sync.Mutex
	hold *lease.Hold // the current hold, nil when not held

	rl *rlMutex // set for a Mutex over a Redlock's masters (see redlock.go)

	cohort cohortBound // WithCohort (cohort.go)
}

// Mutex returns a handle on the plain lock called name. It sends nothing to
// Redis. An empty name or an invalid option makes every method return an
// error wrapping ErrInvalid.
func (c *Client) Mutex(name string, opts ...LockOption) *Mutex {
	return c.newMutex(telemetry.KindMutex, name, opts)
}

// newMutex makes a Mutex whose keys hold the given kind: a plain Mutex, or
// the lock under an Election.
func (c *Client) newMutex(kind, name string, opts []LockOption) *Mutex {
	lc := buildLockConfig(opts)
	m := &Mutex{handle: c.newHandle(kind, name, lc.lease, lc.err, exclKeys...), cohort: lc.cohort}
	m.renewed = lc.renewed
	m.x = newExcl(&m.handle, false)
	return m
}

// Name returns the lock's name, without the key prefix.
func (m *Mutex) Name() string { return m.name }

// Lock blocks until it holds the lock, ctx ends, or the Client closes.
//
// When ctx ends first it returns an error matching both ErrNotObtained and
// ctx.Err(), and leaves nothing held: a grant that raced the end of ctx is
// passed on. Uncontended, Lock is one round trip to Redis. A blocked Lock
// joins the lock's queue in Redis and waits, without polling, for a release
// to hand it the lock: waiters are served in arrival order, whichever Client
// they wait on, and a handed-over lock needs no further round trip. A Lock
// called while the handle itself holds the lock may first be handed the hold
// in-process, within the cohort's bound (WithCohort; WithoutCohort turns
// this off).
func (m *Mutex) Lock(ctx context.Context) error { return m.lock(ctx, "dlock.Mutex.Lock", "lock") }

// lock is Lock for a call of op (its errors name op) recorded as spanName.
func (m *Mutex) lock(ctx context.Context, spanName, op string) (err error) {
	ctx, sp, err := m.beginAcquire(ctx, spanName, op)
	defer func() { sp.EndAcquire(err, err == nil, true) }()
	if err != nil {
		return err
	}
	if m.rl != nil {
		_, err = m.rl.acquire(ctx, op, true)
		return err
	}
	_, err = m.acquisition(ctx, op, true).run()
	return err
}

// TryLock takes the lock if it is free and nobody is queued for it, and
// reports whether it did, in one round trip. A lock held elsewhere is
// (false, nil); an error means Redis could not be asked, or ctx had ended.
// As with sync.Mutex, correct uses of TryLock are rare: most callers want
// Lock with a deadline in ctx.
func (m *Mutex) TryLock(ctx context.Context) (ok bool, err error) {
	ctx, sp, err := m.beginAcquire(ctx, "dlock.Mutex.TryLock", "trylock")
	defer func() { sp.EndAcquire(err, ok, false) }()
	if err != nil {
		return false, err
	}
	if m.rl != nil {
		return m.rl.acquire(ctx, "trylock", false)
	}
	return m.acquisition(ctx, "trylock", false).run()
}

// mutexTry is one Lock or TryLock call of a Mutex: the acquirer of its
// acquisition. Each call holds under a fresh ID.
type mutexTry struct {
	m       *Mutex
	id      string
	reserve int    // tokens its grant reserves after its own (cohort.go)
	waiter  string // id as it queues: see wire.ExclWaiter
}

func (m *Mutex) acquisition(ctx context.Context, op string, block bool) *acquisition {
	id := m.c.newToken()
	t := &mutexTry{m: m, id: id}
	if m.cohortOn() {
		t.reserve = m.cohort.max // the tokens of the local handoffs (cohort.go)
	}
	t.waiter = wire.ExclWaiter(m.lease, t.reserve, id)
	as := wait.As{ID: id}
	if m.cohortOn() {
		as.Cohort, as.Place = m, t.waiter
		as.Local, as.LocalFor = block && m.cohortRunning(), m.cohort.maxTime
	}
	a := m.newAcquisition(ctx, t, op, block, as)
	if as.Local {
		a.as.Queued = func(at time.Time) error {
			a.sent = at
			_, _, err := a.refused("", 0, true, false, m.x.keys[2], m.x.keys[1:2], wire.Spec{Kind: wire.SpecMemberWith, ID: t.waiter})
			return err
		}
	}
	a.as.Handed = func(token uint64) (bool, error) {
		if !a.handedGrant() {
			return false, nil
		}
		ok, _, err := a.granted(func() error { return t.keep(a, token) })
		return ok, err
	}
	return a
}

func (t *mutexTry) try(a *acquisition) (bool, time.Duration, error) {
	m := t.m
	markTTL := a.sending()
	r, err := m.x.try(a.tryCtx(), t.waiter, t.id, t.reserve, a.ttl, markTTL)
	if err != nil {
		return false, 0, t.unknownOutcome(a, err)
	}
	if r.Held {
		return a.granted(func() error { return t.keep(a, r.Token) })
	}
	return a.refused(wire.ClientOf(r.Holder), r.Left, markTTL > 0, r.Queued, m.x.keys[2], m.x.keys[1:2], wire.Spec{Kind: wire.SpecMemberWith, ID: t.waiter})
}

// keep records the granted hold as the handle's.
func (t *mutexTry) keep(a *acquisition, token uint64) error {
	if err := a.fresh(); err != nil {
		return err
	}
	m := t.m
	l := a.newHold(m.key, wire.Spec{Kind: wire.SpecHolder, ID: t.id})
	l.Token = token
	if m.cohortOn() {
		l.Cohort = lease.CohortState{End: token + uint64(m.cohort.max), Since: time.Now()}
	}
	m.mu.Lock()
	old := m.hold
	m.hold = l
	m.mu.Unlock()
	if old != nil {
		// The key was free, so an older hold of this handle that nobody
		// unlocked had already expired or been deleted.
		m.c.wd.Lose(&old.Lease, fmt.Errorf("%w: lease ran out before a new Lock on the handle", ErrLost))
	}
	if err := a.watch(l); err != nil {
		m.mu.Lock()
		if m.hold == l {
			m.hold = nil
		}
		m.mu.Unlock()
		return err
	}
	telemetry.Annotate(a.ctx, telemetry.AttrHoldCount.Int(1), telemetry.AttrToken.Int64(int64(token)))
	return nil
}

func (t *mutexTry) giveBack(a *acquisition) {
	if _, err := t.m.x.unlock(a.nc, t.id); err != nil {
		t.m.x.cancel(a.nc, t.waiter)
	}
}

func (t *mutexTry) leave(a *acquisition) { t.m.x.cancel(a.nc, t.waiter) }

// unknownOutcome handles an acquisition that failed in transit: Redis may
// have granted it, or queued it, with no reply arriving. The ID is unique to
// this call, so giving back whatever it holds is always safe, and it keeps a
// failed Lock from leaving a hold or a queue entry behind. Local waiters are
// woken to look again.
func (t *mutexTry) unknownOutcome(a *acquisition, err error) error {
	if outcomeUnknown(err) {
		t.m.x.cancel(a.nc, t.waiter)
		_, _ = t.m.x.unlock(a.nc, t.id)
		// The lost reply may have named a waiter of this Client that the
		// script handed the lock to, which nobody else will wake.
		t.m.wakeUnknown(err)
	}
	return t.m.fail(a.op, err)
}

// Unlock releases the handle's current hold, in one round trip. If callers
// are queued, the lock passes straight to the first of them.
//
// It returns an error matching ErrNotHeld when the handle holds nothing, and
// one matching ErrLost and ErrNotHeld when the hold was lost before Unlock:
// nothing else changes then, and when the hold was known to be lost before
// the call (its Lost channel had closed), nothing is sent to Redis. Unlock
// sends its request even when ctx has ended, since leaving a lock behind is
// worse than a late call; ctx still carries values such as trace spans.
//
// Lost may fire while the Unlock is on its way, when the hold's deadline
// passes before Redis answers (a slow link): if Redis then still had the
// hold and released it, Unlock returns nil, since nobody held the lock in
// between.
//
// When Unlock fails (Redis could not be reached, or its reply was lost), the
// hold may still be held on the server. It is no longer renewed, so it ends
// by its lease at the latest, and Lost fires then; the failure is logged.
// Calling Unlock again releases it sooner.
func (m *Mutex) Unlock(ctx context.Context) error {
	return m.unlock(ctx, "dlock.Mutex.Unlock", "unlock")
}

// unlock is Unlock for a call of op (its errors name op) recorded as
// spanName.
func (m *Mutex) unlock(ctx context.Context, spanName, op string) (err error) {
	ctx, sp, err := m.begin(ctx, spanName)
	defer func() { sp.EndRelease(err) }()
	if err != nil {
		return err
	}
	m.mu.Lock()
	l := m.hold
	m.hold = nil
	m.mu.Unlock()
	if l == nil {
		return opErr(op, m.name, "", ErrNotHeld)
	}
	if err := m.lostAlready(op, l); err != nil {
		return err
	}
	return m.release(ctx, l, op)
}

// lostAlready returns the error of a release of l, for op, when l was lost
// before it: the release then sends nothing (the hold's lease ran out, or
// Redis said it was gone; what is left of it on the server expires within
// the drift margin), and the caller learns at once that it was lost, rather
// than a network error after a round trip to a server that may be down.
func (h *handle) lostAlready(op string, l *lease.Hold) error {
	if cause := h.c.wd.LostCause(l); cause != nil {
		return opErr(op, h.name, "", cause, ErrNotHeld)
	}
	return nil
}

// release releases l, which Unlock took off the handle: to a goroutine
// waiting on the handle (WithCohort, within its bound), or in Redis.
func (m *Mutex) release(ctx context.Context, l *lease.Hold, op string) error {
	if m.rl != nil {
		return m.rl.unlock(ctx, l)
	}
	if m.cohortOn() {
		if place, ok := m.passLocal(l); ok {
			if place != "" {
				// The new holder runs already; take its place out of the
				// queue in Redis, so that no grant goes to it.
				m.x.cancel(detach(ctx), place)
			}
			return nil
		}
	}
	var local []*wait.Waiter
	var enqueue []string
	if m.cohortOn() {
		// The cohort ends: its local waiters queue in Redis, behind those
		// of other Clients, in their order, in the release's own script
		// (and so ahead of the caller should it lock again); then they are
		// woken to take their places (cohort.go).
		local, enqueue = m.c.waits.EndCohort(m.channel, m.key)
		if h := m.c.hooks; h != nil && h.beforeCohortRelease != nil && len(local) > 0 {
			h.beforeCohortRelease()
		}
	}
	m.beginRelease(l)
	sent := time.Now()
	remaining, err := m.x.unlockCohort(detach(ctx), l.Spec.ID, l.Cohort.Served, enqueue)
	if len(local) > 0 {
		// The script queued them only if l still held the lock.
		for _, place := range m.c.waits.WakeEnded(local, err == nil && remaining == 0, sent) {
			m.x.cancel(detach(ctx), place)
		}
	}
	if err != nil {
		err = m.fail(op, err)
		m.mu.Lock()
		if m.hold == nil {
			m.hold = l // let the caller retry
		}
		m.mu.Unlock()
	}
	return m.settleRelease(op, l, remaining, err, true)
}

// Extend makes the handle's hold end lease from now (from when Redis runs
// the request), whether that is sooner or later than before, in one round
// trip. It works on holds the watchdog renews and on WithLease holds alike;
// from then on the watchdog no longer renews the hold, which ends by the
// new lease unless Extend is called again or Unlock comes first. The
// fencing token stays the same.
//
// It returns an error matching ErrNotHeld when the handle holds nothing,
// and ErrLost when the hold was lost (then nothing changes). When Redis
// cannot be reached the outcome is unknown, and the hold ends by the
// earlier of its old and new leases. A lease outside [MinLease, MaxLease]
// is ErrInvalid.
func (m *Mutex) Extend(ctx context.Context, lease time.Duration) error {
	m.mu.Lock()
	l := m.hold
	m.mu.Unlock()
	if m.rl != nil {
		return m.rl.extend(ctx, "dlock.Mutex.Extend", l, lease)
	}
	return m.extend(ctx, "dlock.Mutex.Extend", l, lease)
}

// Token returns the fencing token of the handle's current hold, or 0 when
// it holds nothing. Tokens are never 0 and strictly greater than every token
// issued earlier for the same name, across Clients, lease expiry and Redis
// restarts; pass it to what the lock protects, so that a guard there (see
// package fence) can refuse the writes of a holder that lost the lock.
func (m *Mutex) Token() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.hold == nil {
		return 0
	}
	return m.hold.Token
}

// IsLocked reports whether anyone holds the lock, in one round trip.
func (m *Mutex) IsLocked(ctx context.Context) (bool, error) {
	if m.rl != nil {
		return m.rl.isLocked(ctx)
	}
	return m.x.isLocked(ctx, "islocked")
}

// TTL returns how long the current hold's lease has left, whoever holds it,
// or 0 when the lock is free. Under the watchdog it stays between two and
// three thirds of the watchdog timeout while held.
func (m *Mutex) TTL(ctx context.Context) (time.Duration, error) {
	if m.rl != nil {
		return m.rl.ttl(ctx)
	}
	return m.x.ttl(ctx, "ttl")
}

// ForceUnlock releases the lock whoever holds it, and hands it to the first
// caller queued, if any, as an Unlock would. It reports whether there was a
// hold to release. This handle's own hold is reported lost at once; a holder
// elsewhere (another handle, another Client) learns of it at its next
// renewal, through Lost and its hold contexts. It is for operators and tests: a holder that is
// still running loses its exclusion.
func (m *Mutex) ForceUnlock(ctx context.Context) (released bool, err error) {
	if m.rl != nil {
		return m.rl.forceUnlock(ctx, "dlock.Mutex.ForceUnlock")
	}
	return m.x.forceUnlock(ctx, "dlock.Mutex.ForceUnlock", func(cause error) {
		m.mu.Lock()
		l := m.hold
		m.mu.Unlock()
		if l != nil {
			m.c.wd.Lose(&l.Lease, cause)
		}
	})
}

// Lost returns a channel that is closed if the current hold is lost: its key
// vanished, renewals failed for a whole lease, its WithLease lease ran out,
// or the Client closed. Unlock does not close it. Lost returns nil (a channel
// that never fires) when the handle holds nothing.
func (m *Mutex) Lost() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.c.wd.LostOf(m.hold)
}

// HoldContext returns a copy of parent that is cancelled when the current
// hold ends: by Unlock, or by loss, in which case context.Cause reports an
// error matching ErrLost. Work done under the lock should use it, so that it
// stops when exclusion can no longer be promised. Without a hold the context
// is already cancelled, with cause ErrNotHeld. Call the CancelFunc when done.
func (m *Mutex) HoldContext(parent context.Context) (context.Context, context.CancelFunc) {
	m.mu.Lock()
	l := m.hold
	m.mu.Unlock()
	return m.c.wd.HoldContext(parent, l)
}

// newToken returns a fresh ID for a Mutex acquisition: the Client's ID and
// a dot, which tell whoever waits who holds the lock, and 128 random bits,
// which make the ID unique.
func (c *Client) newToken() string {
	var random [16]byte
	_, _ = rand.Read(random[:]) // never fails (crypto/rand)
	b := make([]byte, 0, len(c.id)+1+tokenEncoding.EncodedLen(len(random)))
	b = append(b, c.id...)
	b = append(b, '.')
	return string(tokenEncoding.AppendEncode(b, random[:]))
}

// tokenEncoding spells the random part of a token as rand.Text does.
var tokenEncoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// pair decodes a script's {integer, text} reply.
func pair(res []any) (int64, string, error) {
	if len(res) != 2 {
		return 0, "", fmt.Errorf("unexpected reply %v", res)
	}
	n, ok := res[0].(int64)
	msg, ok2 := res[1].(string)
	if !ok || !ok2 {
		return 0, "", fmt.Errorf("unexpected reply %v", res)
	}
	return n, msg, nil
}
