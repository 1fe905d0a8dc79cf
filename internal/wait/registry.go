package wait

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/wire"
)

// The local side of waiting: each Client's registry of its waiting callers,
// one FIFO queue per channel, and the wake-ups that the wait protocol (see
// wait.go) and the release messages deliver to them.

type queue struct {
	head, tail *Waiter
	// cohortKey and cohortAt: where a cohort of this Core runs for lock
	// cohortKey (the engine's hold slot), while the channel has waiters
	// (SetCohort). It goes with the channel's last waiter.
	cohortKey string
	cohortAt  any
}

// waitRegistry holds the local waiters of every channel, in arrival order.
type Registry struct {
	mu     sync.Mutex
	queues map[string]*queue
	byID   map[string]*Waiter
	count  atomic.Int64 // waiters; written under mu, read without it on hot paths
	closed bool
}

func (r *Registry) init() {
	r.queues = make(map[string]*queue)
	r.byID = make(map[string]*Waiter)
}

// Took records that this Client recorded a new hold of owner's on the
// counted lock of channel, and wakes the owner's waiters on it, which can
// re-enter now.
func (r *Registry) Took(channel, owner string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if q := r.queues[channel]; q != nil {
		for w := q.head; w != nil; w = w.next {
			if w.owner == owner {
				// The flag outlives a wake-up lost to one pending
				// (signal keeps the first): see OwnerHolds.
				w.ownerHolds = true
				w.signal(WakeLocal)
			}
		}
	}
}

// OwnerHolds reports whether Took named w's owner since w last tried: a
// wake-up that reached w instead of Took's (the end of a cohort queueing
// it, a subscription's confirmation) must not keep it waiting for a lock
// its owner holds.
func (r *Registry) OwnerHolds(w *Waiter) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return w.ownerHolds
}

// Has reports whether channel has local waiters.
func (r *Registry) Has(channel string) bool {
	if r.count.Load() == 0 { // the uncontended path takes no lock
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.queues[channel] != nil
}

// Join appends a waiter to channel's queue.
func (r *Registry) Join(channel string, as As) (w *Waiter, err error) {
	w = &Waiter{wake: make(chan Reason, 1), channel: channel, kind: as.Kind, id: as.ID, owner: as.Owner, cohort: as.Cohort, place: as.Place, local: as.Local}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, errs.ErrClosed
	}
	if w.id != "" {
		r.byID[w.id] = w
	}
	q := r.queues[channel]
	if q == nil {
		q = &queue{}
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

// Leave removes w. A waiter that leaves without acquiring while a wake-up is
// pending hands the wake-up to the next waiter.
func (r *Registry) Leave(w *Waiter, acquired bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	w.left, w.gaveUp = true, !acquired
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
		// A counted owner's wake-up goes first to another waiter of the
		// same owner: it may be a hand-over to the owner, which that
		// waiter claims with a try.
		if w.owner != "" {
			for o := q.head; o != nil; o = o.next {
				if o.owner == w.owner {
					o.signal(WakeLocal)
					return
				}
			}
		}
		r.wakeLocked(q, wire.Wake{N: 1, Kind: w.kind}, WakeLocal)
	}
}

// Len returns how many waiters are registered, on every channel.
func (r *Registry) Len() int { return int(r.count.Load()) }

// HandedToken returns the fencing token of the latest hand-over w was woken
// for.
func (r *Registry) HandedToken(w *Waiter) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return w.fence
}

// Attempt marks w as acting on its wake-ups: any pending one is consumed.
// It reports true, consuming nothing, when a local handoff has given w a
// hold: w must then take it, and not try in Redis.
func (r *Registry) Attempt(w *Waiter) (granted bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if w.grant != nil {
		return true
	}
	w.local = false // it tries in Redis now, and queues there
	w.woken = false
	w.ownerHolds = false
	select {
	case why := <-w.wake:
		if why == WakeClosed {
			w.wake <- why // closing stays for the wait to see
		}
	default:
	}
	return false
}

// Wake wakes the waiters of channel that spec names and returns how many it
// signalled. Counted wake-ups skip waiters that already have one pending,
// oldest first; spec.N <= 0 wakes all waiters of the kind.
func (r *Registry) Wake(channel string, spec wire.Wake, why Reason) int {
	if r.count.Load() == 0 { // an uncontended release takes no lock
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(spec.IDs) > 0 {
		if spec.Kind == wire.KindHanded {
			why = WakeHanded
		}
		woke := 0
		for _, id := range spec.IDs {
			if w := r.byID[id]; w != nil && w.channel == channel {
				if why == WakeHanded {
					// Only a hand-over carries a token: another wake-up by
					// ID (a mark's place gone) must not clear the token of
					// a hand-over still pending.
					w.fence = spec.Fence
				}
				w.signal(why)
				woke++
				continue
			}
			// A lock handed to an owner (an RWMutex's readers, unclaimed)
			// wakes the owner's read calls, which claim it with a try.
			// (Its write calls each have a grant ID of their own.)
			if q := r.queues[channel]; q != nil && why == WakeHanded {
				for w := q.head; w != nil; w = w.next {
					if w.owner == id && w.kind == wire.KindReader {
						w.signal(WakeLocal)
						woke++
					}
				}
			}
		}
		if why == WakeHanded && spec.TTL > 0 {
			r.retimeOthers(channel, spec)
		}
		return woke
	}
	if q := r.queues[channel]; q != nil {
		return r.wakeLocked(q, spec, why)
	}
	return 0
}

// retimeOthers tells the waiters of channel that a hand-over did not name
// that the new hold ends, at the latest, spec.TTL from now: their fallback
// timers were set for the previous holder's lease, and the new holder may be
// a waiter that died.
func (r *Registry) retimeOthers(channel string, spec wire.Wake) {
	q := r.queues[channel]
	if q == nil {
		return
	}
	at := time.Now().Add(spec.TTL)
	for w := q.head; w != nil; w = w.next {
		if !w.woken && !slices.Contains(spec.IDs, w.id) && !slices.Contains(spec.IDs, w.owner) {
			w.retimeAt = at
			select {
			case w.wake <- WakeRetime:
			default:
			}
		}
	}
}

// Retimed returns when the hold a waiter was told of ends.
func (r *Registry) Retimed(w *Waiter) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return w.retimeAt
}

// HasOwner reports whether channel has a local waiter acquiring for owner
// as a waiter of kind (an RWMutex's readers share their owner's place; its
// writers, each with a grant of its own, do not share theirs).
func (r *Registry) HasOwner(channel, owner string, kind byte) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if q := r.queues[channel]; q != nil {
		for w := q.head; w != nil; w = w.next {
			if w.owner == owner && w.kind == kind {
				return true
			}
		}
	}
	return false
}

func (r *Registry) wakeLocked(q *queue, spec wire.Wake, why Reason) int {
	woke := 0
	for w := q.head; w != nil && (spec.N <= 0 || woke < spec.N); w = w.next {
		// Observers take only their own notices, and the subscription's
		// confirmations: a notice may have been missed before them.
		if spec.Kind != wire.KindAny && w.kind != spec.Kind || w.woken && spec.N > 0 ||
			w.kind == wire.KindObserver && spec.Kind != wire.KindObserver && why != WakeSubscribed {
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
func (w *Waiter) signal(why Reason) {
	w.woken = true
	select {
	case old := <-w.wake:
		if old != WakeRetime {
			w.wake <- old // a real wake-up stays; wakeRetime gives way
		}
	default:
	}
	if why == WakeHanded || why == WakeCohort {
		select {
		case old := <-w.wake:
			if old == WakeClosed { // closing wins over everything
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

func (r *Registry) Close() {
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
			w.wake <- WakeClosed
		}
	}
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	r := &Registry{}
	r.init()
	return r
}

// C is where w's wake-ups arrive.
func (w *Waiter) C() <-chan Reason { return w.wake }

// Cohort is the cohorting Mutex w waits on, or nil.
func (w *Waiter) Cohort() Cohort { return w.cohort }

// Place is w's place in the queue in Redis, for its cohort.
func (w *Waiter) Place() string { return w.place }

// Local reports whether w waits for a local handoff only. Call it only from
// PickCohort's give, under the registry's lock.
func (w *Waiter) Local() bool { return w.local }

// String names a wake-up in the dlock.wake events of spans.
func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return "unknown"
}
