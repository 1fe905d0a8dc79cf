package dlock

import (
	"container/heap"
	"context"
	"fmt"
	"github.com/dlock-go/dlock/internal/telemetry"
	"runtime"
	"slices"
	"time"
)

// Lock cohorting (WithCohort): a Mutex handle that holds the lock, while
// goroutines of its Client wait for the same name (on this handle or on any
// other cohorting Mutex handle of the name), hands the hold to the first of
// them without a round trip to Redis, up to its bound, and only then
// releases to the queue in Redis. Any handle, so that the common
// c.Mutex(name).Lock per call cohorts as a shared handle does.
//
// A Lock on the handle while a cohort runs waits for a local handoff only
// (waitAs.local), without a round trip: it has no place in the queue in
// Redis. If the cohort ends first, the Unlock that releases to Redis queues
// it there in the same script, in local arrival order, and wakes it to start
// its waiting mark (wakeQueued); after the cohort's time bound at the latest
// it tries and queues on its own. Other waiters wait as every Mutex waiter
// does, queued in Redis.
//
// A local handoff picks the first cohorting waiter of the name in this
// Client's registry (arrival order), makes it a new hold of its own on the
// same Redis hold (same holder ID, same lease deadline, the next token of
// the block the Redis grant reserved) on the waiter's handle, and wakes it
// with wakeCohort. If the waiter had a place in the queue in Redis, the
// releasing Unlock then takes it out (excl_cancel), off the new holder's
// path; the Unlock that finally releases to Redis drops every place the
// cohort served first, in case one was queued after its cancel ran. The
// bounds that apply are those of the handle that passes the hold on.

// cohortState is what a hold of a Mutex WithCohort carries from one local
// handoff to the next.
type cohortState struct {
	end    uint64    // the last token the Redis grant reserved; 0: no cohort
	n      int       // local handoffs since the Redis grant
	since  time.Time // when the Redis grant was kept
	served []string  // queue places of the waiters served locally
}

// cohortOn reports whether m hands its holds on locally.
func (m *Mutex) cohortOn() bool {
	return m.cohort.max > 0 && m.rl == nil && m.lease == 0 && m.kind == telemetry.KindMutex
}

// passLocal hands l, just taken off the handle by Unlock, to the first
// goroutine of the Client waiting on a cohorting handle of the name, within
// the bound. It returns the served waiter's place in the queue in Redis (""
// when it had none), or false when it handed nothing: l is then still the
// caller's to release.
func (m *Mutex) passLocal(l *hold) (string, bool) {
	co := l.cohort
	if co.end == 0 || co.n >= m.cohort.max || l.token >= co.end || time.Since(co.since) >= m.cohort.maxTime {
		return "", false
	}
	c := m.c
	var place string
	w := c.waits.pickCohort(m.channel, m.key, func(w *waiter) *hold {
		wm := w.cohort // the waiter's handle: m, or another of the name
		nl := newHold(context.Background(), &wm.handle, l.key, l.spec, l.ttl, true, l.start)
		nl.token = l.token + 1
		nl.cohort = cohortState{end: co.end, n: co.n + 1, since: co.since, served: co.served}
		if !w.local { // it tried in Redis, so it may be queued there
			place = w.place
			nl.cohort.served = append(slices.Clip(co.served), w.place)
		}
		if !c.wd.pass(&l.lease, &nl.lease) {
			return nil
		}
		wm.mu.Lock()
		old := wm.hold
		wm.hold = nl
		wm.mu.Unlock()
		if old != nil {
			// Cannot happen while l held the lock; as keep does, an older
			// hold of the handle is over.
			c.wd.lose(&old.lease, fmt.Errorf("%w: lease ran out before a new Lock on the handle", ErrLost))
		}
		return nl
	})
	if w == nil {
		return "", false
	}
	runtime.Gosched() // let the new holder run, as handedTo does
	return place, true
}

// cohortRunning reports whether the handle holds the lock in a cohort: a
// Lock then waits locally (see waitAs.local), without queueing in Redis, for
// a local handoff or for the end of the cohort, which queues it in Redis in
// its local order, even when the cohort has no room left: a Lock that
// queued in Redis at once would pass the earlier local waiters.
func (m *Mutex) cohortRunning() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.hold != nil && m.hold.cohort.end > 0
}

// endCohort returns the waiters of channel that wait for a local handoff
// only, and their places, in arrival order: the cohort releases to Redis,
// whose script queues them there; wakeEnded then wakes them to try, which
// keeps their places and starts their marks. They may wait on any handle of
// the name: one that ran the cohort earlier and passed it on leaves its
// local waiters to the cohort's next holders.
func (r *waitRegistry) endCohort(channel, key string) (ws []*waiter, places []string) {
	if r.count.Load() == 0 {
		return nil, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if q := r.queues[channel]; q != nil {
		for w := q.head; w != nil; w = w.next {
			if w.cohort != nil && w.cohort.key == key && w.local && w.grant == nil {
				w.local = false
				ws, places = append(ws, w), append(places, w.place)
			}
		}
	}
	return ws, places
}

// wakeEnded wakes the waiters endCohort returned: queued, when the release
// sent at sent queued them in Redis, so that they start their waiting
// marks; else to try. It returns the places of those that left meanwhile
// (their ctx ended), which the release queued after their own cancel may
// have run: the caller must take them out of the queue, passing on a lock
// handed to one. A waiter that leaves after this cancels after the release
// has run, so its own cancel finds its place.
func (r *waitRegistry) wakeEnded(ws []*waiter, queued bool, sent time.Time) (gone []string) {
	if len(ws) == 0 {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range ws {
		if w.left {
			if queued {
				gone = append(gone, w.place)
			}
			continue
		}
		if w.grant != nil {
			continue
		}
		if queued {
			w.queuedAt = sent
			w.signal(wakeQueued)
		} else {
			w.signal(wakeLocal)
		}
	}
	return gone
}

// queuedAt returns when the release that queued w was sent.
func (r *waitRegistry) queuedAt(w *waiter) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return w.queuedAt
}

// abandonCohort releases a hold handed to a waiter that gave up (its ctx
// ended, or the Client closed) before it took it.
func (m *Mutex) abandonCohort(g *hold) {
	m.mu.Lock()
	mine := m.hold == g
	if mine {
		m.hold = nil
	}
	m.mu.Unlock()
	if mine { // else another goroutine unlocked it already
		_ = m.release(context.Background(), g, "unlock")
	}
}

// pickCohort gives a hold to the first waiter of channel on a cohorting
// Mutex handle of key that has none pending: give makes the hold (nil:
// none), and the waiter is woken with wakeCohort. It returns the waiter, or
// nil.
func (r *waitRegistry) pickCohort(channel, key string, give func(w *waiter) *hold) *waiter {
	if r.count.Load() == 0 {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	q := r.queues[channel]
	if q == nil || r.closed {
		return nil
	}
	for w := q.head; w != nil; w = w.next {
		if w.cohort == nil || w.cohort.key != key || w.grant != nil {
			continue
		}
		g := give(w)
		if g == nil {
			return nil
		}
		w.grant = g
		w.signal(wakeCohort)
		return w
	}
	return nil
}

// pass moves the lease of a hold to a new hold nl taken over locally: nl
// keeps old's holder and lease deadline, and is renewed as old was; old ends
// as released. It fails (false) when old is not held, not renewed, being
// released, has less than minValidity of its lease left, or the Client
// closed.
func (w *watchdog) pass(old, nl *lease) bool {
	w.mu.Lock()
	now := w.mono(time.Now())
	if w.closed || old.state != leaseHeld || !old.renew || old.releasing ||
		old.deadline-now < int64(minValidity(old.granted())) {
		w.mu.Unlock()
		return false
	}
	nl.sent, nl.deadline, nl.grantTTL = old.sent, old.deadline, old.grantTTL
	nl.start = w.wall(old.sent)
	heap.Push(&w.deadlines, nl)
	w.schedule(nl, nl.sent+int64(nl.granted()/3))
	w.endLocked(old, leaseReleased, errReleased)
	w.unlock()
	kick(w.clockKick)
	if h, ok := nl.of.(*hold); ok {
		w.tel.HoldStarted(h.kind, h.name)
	}
	return true
}
