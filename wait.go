package dlock

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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

const (
	wakeRelease    wakeReason = iota + 1 // a release message from another Client
	wakeLocal                            // a release by this Client
	wakeSubscribed                       // (re)subscription confirmed: look again
	wakeClosed                           // the Client is closing
	wakeHanded                           // a release handed the lock to this waiter
)

// Waiter kinds, for release messages that wake only one kind.
const (
	kindAny    byte = 0
	kindReader byte = 'r'
	kindWriter byte = 'w'
	kindHanded byte = 'g' // not a waiter kind: the named waiters now hold the lock
)

type waiter struct {
	wake       chan wakeReason // buffered 1; sent to with waitRegistry.mu held
	woken      bool            // a wake-up is pending and not yet acted on
	channel    string
	kind       byte   // kindAny, kindReader or kindWriter
	id         string // optional: the ID a release message may name
	owner      string // optional: the owner of a counted hold it waits for
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
	// handed, when set, is called when a release message says that the lock
	// was handed to this waiter's ID. It returns true when the waiter may
	// take the hold as granted; false makes it try once more.
	handed func() bool
}

// wakeSpec is whom a release wakes: the waiters named in ids, or else n
// waiters (0: all) of the given kind (kindAny: any kind). With ids, kind
// kindHanded says the release handed the lock to them.
type wakeSpec struct {
	n    int
	kind byte
	ids  []string
}

var wakeOne = wakeSpec{n: 1}

type waitQueue struct{ head, tail *waiter }

// waitRegistry holds the local waiters of every channel, in arrival order.
type waitRegistry struct {
	mu     sync.Mutex
	queues map[string]*waitQueue
	byID   map[string]*waiter
	count  atomic.Int64 // waiters; written under mu, read without it on hot paths
	closed bool
}

func (r *waitRegistry) init() {
	r.queues = make(map[string]*waitQueue)
	r.byID = make(map[string]*waiter)
}

// has reports whether channel has local waiters.
func (r *waitRegistry) has(channel string) bool {
	if r.count.Load() == 0 { // the uncontended path takes no lock
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.queues[channel] != nil
}

// join appends a waiter to channel's queue.
func (r *waitRegistry) join(channel string, as waitAs) (w *waiter, err error) {
	w = &waiter{wake: make(chan wakeReason, 1), channel: channel, kind: as.kind, id: as.id, owner: as.owner}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, ErrClosed
	}
	if w.id != "" {
		r.byID[w.id] = w
	}
	q := r.queues[channel]
	if q == nil {
		q = &waitQueue{}
		r.queues[channel] = q
	}
	if q.tail == nil {
		q.head, q.tail = w, w
	} else {
		w.prev, q.tail.next = q.tail, w
		q.tail = w
	}
	r.count.Add(1)
	return w, nil
}

// leave removes w. A waiter that leaves without acquiring while a wake-up is
// pending hands the wake-up to the next waiter.
func (r *waitRegistry) leave(w *waiter, acquired bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	q := r.queues[w.channel]
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		q.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		q.tail = w.prev
	}
	r.count.Add(-1)
	if w.id != "" {
		delete(r.byID, w.id)
	}
	if q.head == nil {
		delete(r.queues, w.channel)
		return
	}
	if w.woken && !acquired {
		r.wakeLocked(q, wakeSpec{n: 1, kind: w.kind}, wakeLocal)
	}
}

// attempt marks w as acting on its wake-ups: any pending one is consumed.
func (r *waitRegistry) attempt(w *waiter) {
	r.mu.Lock()
	w.woken = false
	select {
	case <-w.wake:
	default:
	}
	r.mu.Unlock()
}

// wake wakes the waiters of channel that spec names and returns how many it
// signalled. Counted wake-ups skip waiters that already have one pending,
// oldest first; spec.n <= 0 wakes all waiters of the kind.
func (r *waitRegistry) wake(channel string, spec wakeSpec, why wakeReason) int {
	if r.count.Load() == 0 { // an uncontended release takes no lock
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(spec.ids) > 0 {
		if spec.kind == kindHanded {
			why = wakeHanded
		}
		woke := 0
		for _, id := range spec.ids {
			if w := r.byID[id]; w != nil && w.channel == channel {
				w.signal(why)
				woke++
			}
		}
		return woke
	}
	if q := r.queues[channel]; q != nil {
		return r.wakeLocked(q, spec, why)
	}
	return 0
}

// wakeOwner wakes the waiters of channel that acquire for owner: once the
// owner holds the lock, they can re-enter at once.
func (r *waitRegistry) wakeOwner(channel, owner string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if q := r.queues[channel]; q != nil {
		for w := q.head; w != nil; w = w.next {
			if w.owner == owner {
				w.signal(wakeLocal)
			}
		}
	}
}

// wakeUnknown wakes every local waiter of channel after a release whose
// reply was lost: the release may have happened, and this Client ignores its
// own release messages. A needless wake-up costs one retry.
func (c *Client) wakeUnknown(channel string, err error) {
	if !isRedisError(err) {
		c.waits.wake(channel, wakeSpec{}, wakeLocal)
	}
}

func (r *waitRegistry) wakeLocked(q *waitQueue, spec wakeSpec, why wakeReason) int {
	woke := 0
	for w := q.head; w != nil && (spec.n <= 0 || woke < spec.n); w = w.next {
		if spec.kind != kindAny && w.kind != spec.kind || w.woken && spec.n > 0 {
			continue
		}
		w.signal(why)
		woke++
	}
	return woke
}

// signal marks w woken and delivers why unless a wake-up is already pending;
// wakeHanded replaces a pending one other than wakeClosed, since it tells
// more. Called with waitRegistry.mu held.
func (w *waiter) signal(why wakeReason) {
	w.woken = true
	if why == wakeHanded {
		select {
		case old := <-w.wake:
			if old == wakeClosed { // closing wins over everything
				w.wake <- old
				return
			}
		default:
		}
	}
	select {
	case w.wake <- why:
	default:
	}
}

func (r *waitRegistry) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	for _, q := range r.queues {
		for w := q.head; w != nil; w = w.next {
			w.woken = true
			select {
			case <-w.wake: // replace whatever is pending: closing wins
			default:
			}
			w.wake <- wakeClosed
		}
	}
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
	waiting := c.tel.metricAttrs(as.metric, "", name)
	c.tel.waiters.Add(context.Background(), 1, waiting)
	attempts := 1 // the caller's first try
	defer func() {
		c.waits.leave(w, acquired)
		c.hub.Release(channel)
		c.tel.waiters.Add(context.Background(), -1, waiting) // ctx may be done
		annotate(ctx, attrAttempts.Int(attempts))
	}()

	first := c.retryAfter(left)
	if !confirmed {
		// Normally the confirmation wakes the waiter within a round trip;
		// should it never come, look again soon rather than at the lease.
		first = min(first, time.Second)
	}
	timer := time.NewTimer(first)
	defer timer.Stop()
	// Once subscribed, retry at once: a release may have come between the
	// caller's try and the subscription.
	for retry := confirmed; ; retry = true {
		if retry {
			c.waits.attempt(w)
			attempts++
			ok, left, err := try()
			if err != nil {
				return err
			}
			if ok {
				acquired = true
				return nil
			}
			timer.Reset(c.retryAfter(left))
		}
		select {
		case why := <-w.wake:
			if why == wakeClosed {
				return closedErr(op, name)
			}
			if why == wakeHanded && as.handed != nil && as.handed() {
				wokeUp(ctx, wakeReasonNames[why], attempts)
				acquired = true
				return nil
			}
			wokeUp(ctx, wakeReasonNames[why], attempts+1)
		case <-timer.C:
			wokeUp(ctx, "timer", attempts+1)
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

// releaseOne is the message of a release that lets one waiter proceed.
// Release messages read "from|n|kind|id,id,...": the releasing Client's ID,
// how many waiters to wake (0: all), of which kind ("", "r" or "w"), or the
// IDs of the waiters to wake. Trailing fields may be left out. Scripts that
// decide whom to wake build the message themselves from the Client ID.
func (c *Client) releaseOne() string { return c.oneMsg }

func parseRelease(payload string) (from string, spec wakeSpec) {
	from, rest, _ := strings.Cut(payload, "|")
	nField, rest, _ := strings.Cut(rest, "|")
	kindField, idsField, _ := strings.Cut(rest, "|")
	spec.n = 1
	if n, err := strconv.Atoi(nField); err == nil {
		spec.n = n
	}
	if len(kindField) == 1 {
		spec.kind = kindField[0] // kindReader, kindWriter or kindHanded
	}
	if idsField != "" {
		spec.ids = strings.Split(idsField, ",")
	}
	return from, spec
}
