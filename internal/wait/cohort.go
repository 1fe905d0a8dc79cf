package wait

import (
	"time"

	"github.com/dlock-go/dlock/internal/lease"
)

// The registry's side of lock cohorting (see engine's cohort).

// EndCohort returns the waiters of channel that wait for a local handoff
// only, and their places, in arrival order: the cohort releases to Redis,
// whose script queues them there; WakeEnded then wakes them to start their
// marks (or, if the script did not queue them, to try). They may wait on any handle of
// the name: one that ran the cohort earlier and passed it on leaves its
// local waiters to the cohort's next holders. taken, when set, is called
// for each under the registry's lock, before any of them can act.
func (r *Registry) EndCohort(channel, key string, taken func(w *Waiter)) (ws []*Waiter, places []string) {
	if r.count.Load() == 0 {
		return nil, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if q := r.queues[channel]; q != nil {
		for w := q.head; w != nil; w = w.next {
			if w.cohort != nil && w.cohort.CohortKey() == key && w.local && w.grant == nil {
				w.local = false
				if taken != nil {
					taken(w)
				}
				ws, places = append(ws, w), append(places, w.place)
			}
		}
	}
	return ws, places
}

// WakeEnded wakes the waiters endCohort returned: queued, when the release
// sent at sent queued them in Redis, so that they start their waiting
// marks; else to try. It returns the places of those that gave up
// meanwhile (their ctx ended), which the release queued after their own
// cancel may have run: the caller must take them out of the queue, passing
// on a lock handed to one. Never the place of one that left because it
// acquired (its try found the lock handed to it): that cancel would pass on
// a hold its owner keeps. A waiter that leaves after this cancels after the
// release has run, so its own cancel finds its place.
func (r *Registry) WakeEnded(ws []*Waiter, queued bool, sent time.Time) (gone []string) {
	if len(ws) == 0 {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range ws {
		if w.left {
			if queued && w.gaveUp {
				gone = append(gone, w.place)
			}
			continue
		}
		if w.grant != nil {
			continue
		}
		if queued {
			w.queuedAt = sent
			w.signal(WakeQueued)
		} else {
			w.signal(WakeLocal)
		}
	}
	return gone
}

// StopLocal makes w, which joined to wait for a local handoff only, a
// waiter that tries in Redis, unless a local handoff or the cohort's end
// reached it already. It reports whether it did.
func (r *Registry) StopLocal(w *Waiter) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !w.local || w.grant != nil {
		return false
	}
	w.local = false
	return true
}

// IgnoreIfLocal reports whether w still waits for a local handoff only (no
// try of its own, and no release queued it in Redis), and if so spends the
// wake-up w just received, as Attempt spends one: counted wake-ups then
// reach it, and its Leave passes on nothing. Not when its owner holds now
// (OwnerHolds): then it tries, and re-enters.
func (r *Registry) IgnoreIfLocal(w *Waiter) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	ignore := w.local && !w.ownerHolds
	if ignore {
		w.woken = false
	}
	return ignore
}

// SetCohort records that a cohort of lock key runs at at (the engine's
// hold slot), while channel has waiters: Locks on other handles of key then
// find it (CohortAt). Without waiters it records nothing, and the record
// goes with the channel's last waiter, so it costs nothing per held lock.
func (r *Registry) SetCohort(channel, key string, at any) {
	if r.count.Load() == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if q := r.queues[channel]; q != nil {
		q.cohortKey, q.cohortAt = key, at
	}
}

// CohortAt returns what SetCohort last recorded for channel and key, or nil.
func (r *Registry) CohortAt(channel, key string) any {
	if r.count.Load() == 0 {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if q := r.queues[channel]; q != nil && q.cohortKey == key {
		return q.cohortAt
	}
	return nil
}

// ClearCohort forgets channel's record if it is at.
func (r *Registry) ClearCohort(channel string, at any) {
	if r.count.Load() == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if q := r.queues[channel]; q != nil && q.cohortAt == at {
		q.cohortKey, q.cohortAt = "", nil
	}
}

// QueuedAt returns when the release that queued w was sent.
func (r *Registry) QueuedAt(w *Waiter) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return w.queuedAt
}

// PickCohort gives a hold to the first waiter of channel on a cohort of
// key (a cohorting Mutex handle, or a Semaphore's permit cohort) that has
// none pending: give makes the hold, and the waiter is woken with
// WakeCohort. When give makes none, next says whether to offer it to the
// waiters after this one. It returns the waiter served, or nil.
func (r *Registry) PickCohort(channel, key string, give func(w *Waiter) (h *lease.Hold, next bool)) *Waiter {
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
		if w.cohort == nil || w.cohort.CohortKey() != key || w.grant != nil {
			continue
		}
		g, next := give(w)
		if g == nil {
			if next {
				continue
			}
			return nil
		}
		w.grant = g
		w.signal(WakeCohort)
		return w
	}
	return nil
}

// Settle returns once any PickCohort under way has returned: a waiter that
// a pick's give claimed and then let go (its handoff failed) is free again
// by then.
func (r *Registry) Settle() {
	r.mu.Lock()
	defer r.mu.Unlock() // (the lock is the point: picks hold it throughout)
}

// AnyCohort reports whether a waiter of channel on a cohort of key, for
// which match (given its Cohort) is true, is registered.
func (r *Registry) AnyCohort(channel, key string, match func(c Cohort) bool) bool {
	if r.count.Load() == 0 {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if q := r.queues[channel]; q != nil {
		for w := q.head; w != nil; w = w.next {
			if w.cohort != nil && w.cohort.CohortKey() == key && match(w.cohort) {
				return true
			}
		}
	}
	return false
}
