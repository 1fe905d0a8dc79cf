package redlock

// A blocked Redlock Lock: the wait loop, its timer, and its subscriptions
// to the lock's release channel on every master.

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/telemetry"
	"github.com/dlock-go/dlock/internal/wait"
	"github.com/dlock-go/dlock/internal/wire"
)

// wait blocks until a try succeeds, ctx ends or the Redlock closes. It
// follows internal/wait's protocol, with a subscription on every master: a
// release on any of them wakes the oldest local waiter.
func (rm *Mutex) wait(ctx context.Context, op string, left time.Duration, split bool) (bool, error) {
	h, c := rm.h, rm.r.Core
	channel := rm.keys[2]
	id := c.WaiterID()
	w, err := c.Waits.Join(channel, wait.As{ID: id})
	if err != nil {
		return false, errs.FromWait(op, h.Name, err)
	}
	// A subscription confirmed before this waiter took it gets no
	// confirmation call: the waiter looks again at once, as a release may
	// have come between its try and now.
	subs := rm.subscribe(channel, sync.OnceFunc(func() {
		c.Waits.Wake(channel, wire.Wake{IDs: []string{id}}, wait.WakeSubscribed)
	}))
	acquired := false
	defer func() {
		c.Waits.Leave(w, acquired)
		subs.release()
	}()
	attempts := 1
	timer := time.NewTimer(rm.after(left, split, attempts))
	defer timer.Stop()
	for {
		select {
		case why := <-w.C():
			if why == wait.WakeClosed {
				return false, errs.ClosedOp(op, h.Name)
			}
			if why == wait.WakeRetime {
				continue
			}
			telemetry.WokeUp(ctx, why.String(), attempts+1)
		case <-timer.C:
			telemetry.WokeUp(ctx, "timer", attempts+1)
		case <-ctx.Done():
			return false, errs.NotObtained(op, h.Name, ctx)
		}
		c.Waits.Attempt(w)
		attempts++
		ok, left, split, err := rm.attempt(ctx, op, rm.contended())
		if err != nil && !errors.Is(err, errNoQuorum) {
			return false, err
		}
		if ok {
			acquired = true
			return true, nil
		}
		if err != nil {
			split = true // masters unreachable: look again soon, not at a lease
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(rm.after(left, split, attempts))
	}
}

// after is how long a waiter sleeps without a wake-up: a short random time
// after a split vote (so that two callers do not split again), else just
// past the holder's lease.
func (rm *Mutex) after(left time.Duration, split bool, attempts int) time.Duration {
	if split {
		ttl, _ := rm.h.Terms()
		ceiling := min(time.Duration(attempts)*5*time.Millisecond, max(ttl/20, 5*time.Millisecond), 200*time.Millisecond)
		return time.Millisecond + rand.N(ceiling)
	}
	return rm.r.Core.Loop.RetryAfter(left)
}

// subs is a waiter's subscriptions to a channel on every master; they are
// taken in the background, so that a master that does not answer holds
// nobody up.
type subs struct {
	channel  string
	mu       sync.Mutex
	released bool
	held     []*master
}

func (rm *Mutex) subscribe(channel string, confirmed func()) *subs {
	s := &subs{channel: channel}
	for _, n := range rm.r.nodes {
		rm.r.goCall(func() {
			ctx, cancel := context.WithTimeout(context.Background(), wait.SubscribeTimeout)
			ok, err := n.hub.Acquire(ctx, channel)
			cancel()
			if err != nil {
				return
			}
			if ok {
				confirmed()
			}
			s.mu.Lock()
			if s.released {
				s.mu.Unlock()
				n.hub.Release(channel)
				return
			}
			s.held = append(s.held, n)
			s.mu.Unlock()
		})
	}
	return s
}

func (s *subs) release() {
	s.mu.Lock()
	s.released = true
	held := s.held
	s.held = nil
	s.mu.Unlock()
	for _, n := range held {
		n.hub.Release(s.channel)
	}
}
