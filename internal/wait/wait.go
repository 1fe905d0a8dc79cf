package wait

import (
	"context"
	"time"

	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/lease"
	"github.com/dlock-go/dlock/internal/pubsub"
	"github.com/dlock-go/dlock/internal/telemetry"
)

// The wait protocol, shared by every blocking call:
//
//  1. The caller tried once and failed (see each primitive).
//  2. It joins the local FIFO queue of the lock's channel, then takes a
//     reference on the channel's subscription. Joining first matters: the
//     subscription's confirmation wakes everyone in the queue, so it cannot
//     slip between the two steps.
//  3. If the subscription was already confirmed it retries at once; otherwise
//     the confirmation wakes it to retry. From the confirmation on, every
//     release reaches the queue, so no release can fall between a failed try
//     and the wait.
//  4. It sleeps until a wake-up (a release message, a local release, a
//     re-subscription after a reconnect), the holder's remaining lease (the
//     fallback when a message is lost or a lease simply expires), or ctx.
//     Then it retries.
//
// A release message says whom to wake: a number of waiters (oldest first),
// optionally only those of one kind (readers or writers of an RWMutex), or a
// list of waiter IDs (semaphore waiters that freed permits can serve, when
// no release granted them), or the IDs a release handed the lock or permits
// to (kind g), whose waiters then hold without trying again (As.Handed).
// Each Client applies it to its own waiters. A waiter that was woken but
// leaves without acquiring passes its wake-up on, so a cancelled waiter
// never swallows a release that the next one needed.

type Reason uint8

// wakeReasonNames name the wake-ups in the dlock.wake events of spans.
var reasonNames = [...]string{WakeRelease: "notification", WakeLocal: "local_release",
	WakeSubscribed: "subscribed", WakeClosed: "closed", WakeHanded: "handed", WakeRetime: "retime", WakeCohort: "cohort", WakeQueued: "queued"}

const (
	WakeRelease    Reason = iota + 1 // a release message from another Client
	WakeLocal                        // a release by this Client
	WakeSubscribed                   // (re)subscription confirmed: look again
	WakeClosed                       // the Client is closing
	WakeHanded                       // a release handed the lock to this waiter
	WakeRetime                       // not a wake-up: the lock changed hands; its new lease ends at retimeAt
	WakeCohort                       // a local handoff gave this waiter a hold (cohort.go)
	WakeQueued                       // a cohort's end queued this local waiter in Redis at queuedAt (cohort.go)
)

type Waiter struct {
	wake       chan Reason // buffered 1; sent to with waitRegistry.mu held
	woken      bool        // a wake-up is pending and not yet acted on
	channel    string
	kind       byte        // wire.KindAny, wire.KindReader or wire.KindWriter
	id         string      // optional: the ID a release message may name
	owner      string      // optional: the owner of a counted hold it waits for
	ownerHolds bool        // Took since its last try: its owner holds now; guarded by waitRegistry.mu
	fence      uint64      // the token of the latest hand-over it was woken for; guarded by waitRegistry.mu
	retimeAt   time.Time   // when the lease of the hold the lock was last handed to ends; guarded by waitRegistry.mu
	cohort     Cohort      // a waiter of a cohorting Mutex (its handle) or of a Semaphore's permit cohort (its call)
	place      string      // its place in the queue in Redis, for cohort
	local      bool        // it waits for a local handoff only, without a place in Redis yet; guarded by waitRegistry.mu
	grant      *lease.Hold // a hold a local handoff gave it; guarded by waitRegistry.mu
	queuedAt   time.Time   // when the release that queued it in Redis was sent; guarded by waitRegistry.mu
	left       bool        // it left the registry; guarded by waitRegistry.mu
	gaveUp     bool        // it left without acquiring; guarded by waitRegistry.mu
	prev, next *Waiter
}

// Cohort is a handle of a cohorting Mutex (see engine's cohort), or a
// Semaphore's Acquire call (its permit cohort), as the registry knows it:
// the key its holds are handed on under, and how to give back a hold
// handed to one of its waiters that gave up before it took it.
type Cohort interface {
	CohortKey() string
	Abandon(h *lease.Hold)
}

// As describes a waiter to the registry: its kind, the ID under which
// release messages may name it, and the owner it acquires for ("" for none).
// Metric is the primitive's kind for the waiters gauge.
type As struct {
	Kind   byte
	ID     string
	Owner  string
	Metric string
	// Handed, when set, is called when a release says that the lock was
	// handed to this waiter's ID, with the hold's fencing token. It reports
	// whether the waiter now holds it; false makes it try once more, and an
	// error ends the wait.
	Handed func(token uint64) (bool, error)
	// Cohort, when set, is the cohorting Mutex whose holds may be handed to
	// the waiter locally, and Place its place in the queue in Redis.
	Cohort Cohort
	Place  string
	// Local: the waiter waits for a local handoff of Cohort's running
	// cohort, without trying in Redis, for at most LocalFor, or until the
	// cohort ends.
	Local    bool
	LocalFor time.Duration
	// CohortRuns, for a Local waiter, reports whether the cohort it waits
	// for still runs. The waiter asks once it has joined the registry, and
	// tries in Redis when it does not: the cohort may have ended (and
	// queued its local waiters) between the caller's look and the join.
	CohortRuns func() bool
	// Queued, when set, records that the end of the cohort queued the
	// waiter in Redis, by a release sent at the time given: the waiter then
	// keeps its place with a waiting mark, without trying. An error ends
	// the wait.
	Queued func(at time.Time) error
}

// TryFunc makes one acquisition attempt. When it fails it returns how long
// the holder's lease has left, or 0 when that is unknown.
type TryFunc func() (ok bool, left time.Duration, err error)

// SubscribeTimeout bounds a waiter's SUBSCRIBE on the shared connection.
const SubscribeTimeout = 5 * time.Second

// Loop is how a Client's blocking calls wait: its registry of waiters, its
// pub/sub hub, its telemetry, and how long to sleep when a try says
// nothing of the holder's lease (Timeout: the watchdog timeout).
type Loop struct {
	Reg     *Registry
	Hub     *pubsub.Hub
	Tel     *telemetry.Telemetry
	Timeout time.Duration
	// BeforeRetry, when set (by tests), runs when w is about to look again.
	BeforeRetry func(w *Waiter)
}

// Wait blocks until try succeeds, ctx ends, or the Client closes, following
// the protocol above. left is what the caller's first, failed try returned.
func (l *Loop) Wait(ctx context.Context, op, name, channel string, as As, left time.Duration, try TryFunc) error {
	w, err := l.Reg.Join(channel, as)
	if err != nil {
		return errs.FromWait(op, name, err)
	}
	if as.Local && as.CohortRuns != nil && !as.CohortRuns() && l.Reg.StopLocal(w) {
		as.Local = false
	}
	// The subscription is the Client's, not the caller's: a deadline in ctx
	// must not cut a write on the shared connection short.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), SubscribeTimeout)
	confirmed, err := l.Hub.Acquire(sctx, channel)
	cancel()
	if err != nil {
		l.Reg.Leave(w, false)
		if w.grant != nil {
			// A local handoff reached it while it subscribed, which can
			// take seconds: it gives the hold back, as below.
			as.Cohort.Abandon(w.grant)
		}
		return errs.FromWait(op, name, err)
	}
	acquired := false
	l.Tel.Waiters(1, as.Metric, name)
	attempts := 1 // the caller's first try
	defer func() {
		l.Reg.Leave(w, acquired)
		if w.grant != nil && !acquired {
			as.Cohort.Abandon(w.grant) // handed a hold it will not take
		}
		l.Hub.Release(channel)
		l.Tel.Waiters(-1, as.Metric, name)
		telemetry.Annotate(ctx, telemetry.AttrAttempts.Int(attempts))
	}()

	first := l.RetryAfter(left)
	if as.Local {
		first = min(first, as.LocalFor)
	}
	if !confirmed {
		// Normally the confirmation wakes the waiter within a round trip;
		// should it never come, look again soon rather than at the lease.
		first = min(first, time.Second)
	}
	timer := time.NewTimer(first)
	timerAt := time.Now().Add(first)
	defer timer.Stop()
	// Once subscribed, retry at once: a release may have come between the
	// caller's try and the subscription.
	retry := confirmed && !as.Local
	for {
		if retry {
			if l.BeforeRetry != nil {
				l.BeforeRetry(w)
			}
			if l.Reg.Attempt(w) {
				// A local handoff gave it a hold before it could try: take
				// it. Trying in Redis now would queue a place that nobody
				// claims, and the cohort's release would hand the lock to it.
				if ctx.Err() != nil {
					return errs.NotObtained(op, name, ctx)
				}
				telemetry.WokeUp(ctx, reasonNames[WakeCohort], attempts)
				acquired = true
				return nil
			}
			attempts++
			ok, left, err := try()
			if err != nil {
				return err
			}
			if ok {
				acquired = true
				return nil
			}
			timerAt = time.Now().Add(l.RetryAfter(left))
			timer.Reset(time.Until(timerAt))
		}
		retry = true
		select {
		case why := <-w.wake:
			if why == WakeRetime {
				// The lock changed hands: look again when the new hold
				// ends, if that comes before the timer set for the old one.
				if at := l.Reg.Retimed(w).Add(time.Millisecond); at.Before(timerAt) {
					timerAt = at
					timer.Reset(time.Until(at))
				}
				retry = false
				continue
			}
			if why == WakeClosed {
				return errs.ClosedOp(op, name)
			}
			if why == WakeSubscribed && l.Reg.IgnoreIfLocal(w) { // (not when its owner holds now: see Took)
				// A waiter for a local handoff has no place in Redis that a
				// release missed before the confirmation could concern.
				retry = false
				continue
			}
			if why == WakeQueued && as.Queued != nil {
				if err := as.Queued(l.Reg.QueuedAt(w)); err != nil {
					return err
				}
				if !l.Reg.OwnerHolds(w) {
					// Its place is in Redis now: wait as any queued waiter.
					timerAt = time.Now().Add(l.RetryAfter(0))
					timer.Reset(time.Until(timerAt))
					retry = false
					continue
				}
				// Its owner holds now (Took's wake-up may have been lost
				// to this one): it tries, and re-enters.
			}
			if why == WakeCohort {
				if ctx.Err() != nil {
					return errs.NotObtained(op, name, ctx)
				}
				telemetry.WokeUp(ctx, reasonNames[why], attempts)
				acquired = true
				return nil
			}
			if why == WakeHanded && as.Handed != nil {
				ok, err := as.Handed(l.Reg.HandedToken(w))
				if err != nil {
					return err
				}
				if ok {
					telemetry.WokeUp(ctx, reasonNames[why], attempts)
					acquired = true
					return nil
				}
			}
			telemetry.WokeUp(ctx, reasonNames[why], attempts+1)
		case <-timer.C:
			telemetry.WokeUp(ctx, "timer", attempts+1)
		case <-ctx.Done():
			return errs.NotObtained(op, name, ctx)
		}
	}
}

// RetryAfter is how long a waiter sleeps without a wake-up: just past the
// holder's remaining lease, when the lock frees itself even if no message
// says so. A lock with no expiry (not one dlock wrote) is re-checked every
// watchdog timeout.
func (l *Loop) RetryAfter(left time.Duration) time.Duration {
	if left <= 0 {
		return l.Timeout
	}
	return left + time.Millisecond
}
