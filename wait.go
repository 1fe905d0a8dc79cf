package dlock

import (
	"context"
	"github.com/dlock-go/dlock/internal/telemetry"
	"time"
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
// list of waiter IDs (semaphore waiters the freed permits can serve), or the
// ID of the Mutex waiter the lock was handed to, which then holds it without
// trying again. Each Client applies it to its own waiters. A waiter that was woken but leaves
// without acquiring passes its wake-up on, so a cancelled waiter never
// swallows a release that the next one needed.

type wakeReason uint8

// wakeReasonNames name the wake-ups in the dlock.wake events of spans.
var wakeReasonNames = [...]string{wakeRelease: "notification", wakeLocal: "local_release",
	wakeSubscribed: "subscribed", wakeClosed: "closed", wakeHanded: "handed", wakeRetime: "retime", wakeCohort: "cohort", wakeQueued: "queued"}

const (
	wakeRelease    wakeReason = iota + 1 // a release message from another Client
	wakeLocal                            // a release by this Client
	wakeSubscribed                       // (re)subscription confirmed: look again
	wakeClosed                           // the Client is closing
	wakeHanded                           // a release handed the lock to this waiter
	wakeRetime                           // not a wake-up: the lock changed hands; its new lease ends at retimeAt
	wakeCohort                           // a local handoff gave this waiter a hold (cohort.go)
	wakeQueued                           // a cohort's end queued this local waiter in Redis at queuedAt (cohort.go)
)

type waiter struct {
	wake       chan wakeReason // buffered 1; sent to with waitRegistry.mu held
	woken      bool            // a wake-up is pending and not yet acted on
	channel    string
	kind       byte      // wire.KindAny, wire.KindReader or wire.KindWriter
	id         string    // optional: the ID a release message may name
	owner      string    // optional: the owner of a counted hold it waits for
	fence      uint64    // the token of the latest hand-over it was woken for; guarded by waitRegistry.mu
	retimeAt   time.Time // when the lease of the hold the lock was last handed to ends; guarded by waitRegistry.mu
	cohort     *Mutex    // a waiter of a Mutex WithCohort: its handle
	place      string    // its place in the queue in Redis, for cohort
	local      bool      // it waits for a local handoff only, without a place in Redis yet; guarded by waitRegistry.mu
	grant      *hold     // a hold a local handoff gave it; guarded by waitRegistry.mu
	queuedAt   time.Time // when the release that queued it in Redis was sent; guarded by waitRegistry.mu
	left       bool      // it left the registry; guarded by waitRegistry.mu
	prev, next *waiter
}

// waitAs describes a waiter to the registry: its kind, the ID under which
// release messages may name it, and the owner it acquires for ("" for none).
// metric is the primitive's kind for the waiters gauge.
type waitAs struct {
	kind   byte
	id     string
	owner  string
	metric string
	// handed, when set, is called when a release says that the lock was
	// handed to this waiter's ID, with the hold's fencing token. It reports
	// whether the waiter now holds it; false makes it try once more, and an
	// error ends the wait.
	handed func(token uint64) (bool, error)
	// cohort, when set, is the Mutex WithCohort whose holds may be handed to
	// the waiter locally, and place its place in the queue in Redis.
	cohort *Mutex
	place  string
	// local: the waiter waits for a local handoff of cohort's running
	// cohort, without trying in Redis, for at most localFor, or until the
	// cohort ends (cohort.go).
	local    bool
	localFor time.Duration
	// queued, when set, records that the end of the cohort queued the
	// waiter in Redis, by a release sent at the time given: the waiter then
	// keeps its place with a waiting mark, without trying. An error ends
	// the wait.
	queued func(at time.Time) error
}

// tryFunc makes one acquisition attempt. When it fails it returns how long
// the holder's lease has left, or 0 when that is unknown.
type tryFunc func() (ok bool, left time.Duration, err error)

// wait blocks until try succeeds, ctx ends, or the Client closes, following
// the protocol above. left is what the caller's first, failed try returned.
func (c *Client) wait(ctx context.Context, op, name, channel string, as waitAs, left time.Duration, try tryFunc) error {
	w, err := c.waits.join(channel, as)
	if err != nil {
		return waitErr(op, name, err)
	}
	// The subscription is the Client's, not the caller's: a deadline in ctx
	// must not cut a write on the shared connection short.
	sctx, cancel := context.WithTimeout(detach(ctx), subscribeTimeout)
	confirmed, err := c.hub.Acquire(sctx, channel)
	cancel()
	if err != nil {
		c.waits.leave(w, false)
		return waitErr(op, name, err)
	}
	acquired := false
	c.tel.Waiters(1, as.metric, name)
	attempts := 1 // the caller's first try
	defer func() {
		c.waits.leave(w, acquired)
		if w.grant != nil && !acquired {
			as.cohort.abandonCohort(w.grant) // handed a hold it will not take
		}
		c.hub.Release(channel)
		c.tel.Waiters(-1, as.metric, name)
		telemetry.Annotate(ctx, telemetry.AttrAttempts.Int(attempts))
	}()

	first := c.retryAfter(left)
	if as.local {
		first = min(first, as.localFor)
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
	retry := confirmed && !as.local
	for {
		if retry {
			if h := c.hooks; h != nil && h.beforeRetry != nil {
				h.beforeRetry(w)
			}
			if c.waits.attempt(w) {
				// A local handoff gave it a hold before it could try: take
				// it. Trying in Redis now would queue a place that nobody
				// claims, and the cohort's release would hand the lock to it.
				if ctx.Err() != nil {
					return notObtained(op, name, ctx)
				}
				telemetry.WokeUp(ctx, wakeReasonNames[wakeCohort], attempts)
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
			timerAt = time.Now().Add(c.retryAfter(left))
			timer.Reset(time.Until(timerAt))
		}
		retry = true
		select {
		case why := <-w.wake:
			if why == wakeRetime {
				// The lock changed hands: look again when the new hold
				// ends, if that comes before the timer set for the old one.
				if at := c.waits.retimed(w).Add(time.Millisecond); at.Before(timerAt) {
					timerAt = at
					timer.Reset(time.Until(at))
				}
				retry = false
				continue
			}
			if why == wakeClosed {
				return closedErr(op, name)
			}
			if why == wakeQueued && as.queued != nil {
				if err := as.queued(c.waits.queuedAt(w)); err != nil {
					return err
				}
				// Its place is in Redis now: wait as any queued waiter.
				timerAt = time.Now().Add(c.retryAfter(0))
				timer.Reset(time.Until(timerAt))
				retry = false
				continue
			}
			if why == wakeCohort {
				if ctx.Err() != nil {
					return notObtained(op, name, ctx)
				}
				telemetry.WokeUp(ctx, wakeReasonNames[why], attempts)
				acquired = true
				return nil
			}
			if why == wakeHanded && as.handed != nil {
				ok, err := as.handed(c.waits.handedToken(w))
				if err != nil {
					return err
				}
				if ok {
					telemetry.WokeUp(ctx, wakeReasonNames[why], attempts)
					acquired = true
					return nil
				}
			}
			telemetry.WokeUp(ctx, wakeReasonNames[why], attempts+1)
		case <-timer.C:
			telemetry.WokeUp(ctx, "timer", attempts+1)
		case <-ctx.Done():
			return notObtained(op, name, ctx)
		}
	}
}

// retryAfter is how long a waiter sleeps without a wake-up: just past the
// holder's remaining lease, when the lock frees itself even if no message
// says so. A lock with no expiry (not one dlock wrote) is re-checked every
// watchdog timeout.
func (c *Client) retryAfter(left time.Duration) time.Duration {
	if left <= 0 {
		return c.cfg.watchdog
	}
	return left + time.Millisecond
}
