package dlock

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
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
// A release message names how many waiters to wake; each Client wakes that
// many of its own, oldest first. A waiter that was woken but leaves without
// acquiring passes its wake-up on, so a cancelled waiter never swallows a
// release that the next one needed.

type wakeReason uint8

const (
	wakeRelease    wakeReason = iota + 1 // a release message from another Client
	wakeLocal                            // a release by this Client
	wakeSubscribed                       // (re)subscription confirmed: look again
	wakeClosed                           // the Client is closing
)

type waiter struct {
	wake       chan wakeReason // buffered 1; sent to with waitRegistry.mu held
	woken      bool            // a wake-up is pending and not yet acted on
	channel    string
	prev, next *waiter
}

type waitQueue struct{ head, tail *waiter }

// waitRegistry holds the local waiters of every channel, in arrival order.
type waitRegistry struct {
	mu     sync.Mutex
	queues map[string]*waitQueue
	count  int
	closed bool
}

func (r *waitRegistry) init() { r.queues = make(map[string]*waitQueue) }

func (r *waitRegistry) join(channel string) (*waiter, error) {
	w := &waiter{wake: make(chan wakeReason, 1), channel: channel}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, ErrClosed
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
	r.count++
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
	r.count--
	if q.head == nil {
		delete(r.queues, w.channel)
		return
	}
	if w.woken && !acquired {
		r.wakeLocked(q, 1, wakeLocal)
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

// wake wakes up to n waiters of channel that have no wake-up pending, oldest
// first; n <= 0 wakes them all.
func (r *waitRegistry) wake(channel string, n int, why wakeReason) {
	r.mu.Lock()
	if q := r.queues[channel]; q != nil {
		r.wakeLocked(q, n, why)
	}
	r.mu.Unlock()
}

func (r *waitRegistry) wakeLocked(q *waitQueue, n int, why wakeReason) {
	woke := 0
	for w := q.head; w != nil && (n <= 0 || woke < n); w = w.next {
		if w.woken && n > 0 {
			continue
		}
		w.woken = true
		select {
		case w.wake <- why:
		default:
		}
		woke++
	}
}

// waiting reports how many callers are blocked.
func (r *waitRegistry) waiting() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.count
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
func (c *Client) wait(ctx context.Context, op, name, channel string, left time.Duration, try tryFunc) error {
	w, err := c.waits.join(channel)
	if err != nil {
		return err
	}
	confirmed, err := c.hub.Acquire(context.WithoutCancel(ctx), channel)
	if err != nil {
		c.waits.leave(w, false)
		return fmt.Errorf("dlock: %s %q: subscribe: %w", op, name, err)
	}
	acquired := false
	defer func() {
		c.waits.leave(w, acquired)
		c.hub.Release(channel)
	}()

	timer := time.NewTimer(c.retryAfter(left))
	defer timer.Stop()
	for retry := confirmed; ; retry = true {
		if retry {
			c.waits.attempt(w)
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
				return ErrClosed
			}
		case <-timer.C:
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

// releaseMessage is published when a lock is released: the releasing
// Client's ID, and how many waiters each Client should wake (0: all).
func (c *Client) releaseMessage(n int) string {
	return c.id + "|" + strconv.Itoa(n)
}

func parseRelease(payload string) (from string, n int) {
	i := strings.LastIndexByte(payload, '|')
	if i < 0 {
		return payload, 1
	}
	n, err := strconv.Atoi(payload[i+1:])
	if err != nil {
		n = 1
	}
	return payload[:i], n
}
