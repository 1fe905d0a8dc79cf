package redisson

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/errs"
)

// subscriptions are a Client's pub/sub subscriptions, shared by its waiting
// calls as a Redisson client shares one per channel among its threads: one
// topic per channel, subscribed while the channel has a waiter, and one
// dispatch goroutine per *redis.PubSub that fans each message out to every
// waiter of its channel.
//
// Classic channels share one PubSub, so one connection, opened with the
// first classic topic and closed with the last. A sharded channel has a
// PubSub of its own: go-redis binds a sharded PubSub on a Cluster to the
// node serving its channel's slot, and the server ends a sharded
// subscription by itself when the slot migrates.
//
// Lock order: ioMu, then mu. mu guards the bookkeeping only and is never
// held during network I/O, nor while taking Client.mu or Client.modeMu.
// ioMu is held around each Subscribe, Unsubscribe and Close of the shared
// classic PubSub, so that the commands reach the server in the order of
// the bookkeeping they follow (an UNSUBSCRIBE of a channel's last waiter
// before a SUBSCRIBE of its next first one). go-redis serializes those
// calls on the PubSub's own mutex anyway, so ioMu makes nobody wait longer
// than go-redis would; a waiter joining a subscribed topic, leaving one
// that keeps waiters, or being woken never takes ioMu.
type subscriptions struct {
	ioMu sync.Mutex

	mu      sync.Mutex // guards the fields below and every topic's and waiter's
	closed  bool
	classic *redis.PubSub // shared by the classic topics; nil when there is none
	topics  map[string]*topic
	wg      sync.WaitGroup // one per dispatch goroutine
}

// subState is where a topic's subscription stands.
type subState uint8

const (
	// lapsed: no subscription is in effect or being made. A new topic
	// starts so; so does one whose subscription the server ended, or whose
	// confirmation did not come in time. The next waiter that needs the
	// subscription makes it.
	lapsed subState = iota
	// subscribing: a subscription was asked for (generation gen) and not yet
	// confirmed.
	subscribing
	// confirmed: the server confirmed the subscription.
	confirmed
)

// topic is one channel's subscription and its waiters.
type topic struct {
	channel   string
	sharded   bool
	waiters   map[*waiter]struct{}
	ps        *redis.PubSub // the subscription's PubSub: the shared one for classic
	state     subState
	gen       uint64        // counts the subscriptions asked for
	sent      time.Time     // when generation gen was asked for; zero while it is being sent
	confirmed chan struct{} // closed when generation gen is confirmed
	gone      bool          // removed with its last waiter, or closed
}

// waiter is one waiting call's place in a topic.
type waiter struct {
	t *topic
	// wake holds a pending hint to try again: a message on the channel, a
	// confirmation (a re-subscription after a reconnect among them), or
	// the end of the subscription.
	wake chan struct{}
}

// join adds a waiter to channel's topic, creating it (unsubscribed) if
// needed. The caller must leave it.
func (c *Client) join(ctx context.Context, op, name, channel string) (*waiter, error) {
	sharded, err := c.shardedPubSub(ctx)
	if err != nil {
		return nil, redisErr(op, name, "redisson", err)
	}
	s := &c.subs
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errs.ClosedOp(op, name)
	}
	t := s.topics[channel]
	if t == nil { // the kind, once decided, never changes: a topic's is the Client's
		t = &topic{channel: channel, sharded: sharded, waiters: make(map[*waiter]struct{})}
		s.topics[channel] = t
	}
	w := &waiter{t: t, wake: make(chan struct{}, 1)}
	t.waiters[w] = struct{}{}
	return w, nil
}

// leave removes w from its topic. The last waiter removes the topic, and
// unsubscribes: it closes a sharded topic's PubSub, and unsubscribes from
// the shared classic one, or closes it when no classic topic is left.
func (c *Client) leave(w *waiter) {
	s := &c.subs
	t := w.t
	s.mu.Lock()
	delete(t.waiters, w)
	if len(t.waiters) > 0 || t.gone || s.closed {
		s.mu.Unlock()
		return
	}
	if t.sharded {
		t.gone = true
		if s.topics[t.channel] == t {
			delete(s.topics, t.channel)
		}
		ps := t.ps
		t.ps = nil
		s.mu.Unlock()
		if ps != nil {
			_ = ps.Close()
		}
		return
	}
	s.mu.Unlock()

	s.ioMu.Lock()
	defer s.ioMu.Unlock()
	s.mu.Lock()
	if len(t.waiters) > 0 || t.gone || s.closed {
		s.mu.Unlock() // a waiter joined meanwhile, or Close ran
		return
	}
	t.gone = true
	if s.topics[t.channel] == t {
		delete(s.topics, t.channel)
	}
	ps := t.ps
	t.ps = nil
	last := true
	for _, o := range s.topics {
		if !o.sharded {
			last = false
			break
		}
	}
	if last {
		ps = s.classic
		s.classic = nil
	}
	s.mu.Unlock()
	switch {
	case ps == nil:
	case last:
		_ = ps.Close()
	default:
		_ = ps.Unsubscribe(c.ctx, t.channel)
	}
}

// subscribed returns when w's topic is subscribed and confirmed. It asks
// for a subscription when none is in effect or being asked for, and follows
// the one being asked for otherwise: a topic confirmed already needs no new
// confirmation (the caller tries again after joining it anyway). A
// subscription not confirmed within limit after it was sent is given up
// (lapsed), and the call asks again, until limit after the first request
// it saw sent; then it returns an error matching dlock.ErrUnavailable.
func (c *Client) subscribed(ctx context.Context, op, name string, w *waiter, limit time.Duration) error {
	s := &c.subs
	t := w.t
	var deadline time.Time // limit after the first request this call saw sent
	timer := time.NewTimer(limit)
	defer timer.Stop()
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return errs.ClosedOp(op, name)
		}
		now := time.Now()
		next := limit // while a request is being sent, look again after limit
		if t.state == subscribing && !t.sent.IsZero() {
			if deadline.IsZero() {
				deadline = t.sent.Add(limit)
			}
			if due := t.sent.Add(limit); now.Before(due) {
				next = due.Sub(now)
			} else {
				t.state = lapsed // given up: every waiter may ask again
				t.wakeLocked()
			}
		}
		var old *redis.PubSub
		start := false
		switch {
		case t.state == confirmed:
			s.mu.Unlock()
			// The caller tries next: a wake-up pending from before is spent.
			select {
			case <-w.wake:
			default:
			}
			return nil
		case !deadline.IsZero() && !now.Before(deadline):
			s.mu.Unlock()
			return errs.Op(op, name, "the subscription was not confirmed in time", dlock.ErrUnavailable)
		case t.state == lapsed:
			start = true
			t.gen++
			t.state = subscribing
			t.sent = time.Time{}
			t.confirmed = make(chan struct{})
			if t.sharded {
				old, t.ps = t.ps, nil // its messages are ignored from now on
			}
		}
		if !deadline.IsZero() {
			next = min(next, deadline.Sub(now))
		}
		gen, ok := t.gen, t.confirmed
		s.mu.Unlock()
		if old != nil {
			_ = old.Close()
		}
		if start {
			c.subscribe(t, gen)
			next = limit
		}
		timer.Reset(max(next, time.Millisecond))
		select {
		case <-ok:
		case <-w.wake: // confirmed, given up or ended: look again
		case <-timer.C:
		case <-ctx.Done():
			return errs.NotObtained(op, name, ctx)
		case <-c.closing:
			return errs.ClosedOp(op, name)
		}
	}
}

// subscribe asks for generation gen of t's subscription, unless it is
// superseded, t is gone or the Client closed. Errors are left to the
// confirmation: go-redis subscribes again to every channel of a PubSub
// when it reconnects.
func (c *Client) subscribe(t *topic, gen uint64) {
	s := &c.subs
	if t.sharded {
		// On a Cluster, go-redis binds the PubSub to the node serving the
		// channel's slot, as the cluster client last knew it.
		ps := c.rdb.SSubscribe(c.ctx, t.channel)
		s.mu.Lock()
		if s.closed || t.gone || t.gen != gen {
			s.mu.Unlock()
			_ = ps.Close()
			return
		}
		t.ps = ps
		t.sent = time.Now()
		s.dispatchLocked(c, ps)
		s.mu.Unlock()
		return
	}
	s.ioMu.Lock()
	defer s.ioMu.Unlock()
	s.mu.Lock()
	if s.closed || t.gone || t.gen != gen {
		s.mu.Unlock()
		return
	}
	if s.classic == nil {
		s.classic = c.rdb.Subscribe(c.ctx) // no channel yet: no I/O
		s.dispatchLocked(c, s.classic)
	}
	ps := s.classic
	t.ps = ps
	s.mu.Unlock()
	_ = ps.Subscribe(c.ctx, t.channel)
	s.mu.Lock()
	if t.gen == gen {
		t.sent = time.Now()
	}
	s.mu.Unlock()
}

// dispatchLocked starts the goroutine that reads ps and fans its messages
// out. s.mu is held and s is open.
func (s *subscriptions) dispatchLocked(c *Client, ps *redis.PubSub) {
	msgs := ps.ChannelWithSubscriptions(redis.WithChannelSize(128))
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		// Read until go-redis closes msgs (the PubSub was closed): a reader
		// that stopped would hold go-redis's goroutine up to a minute.
		for m := range msgs {
			switch m := m.(type) {
			case *redis.Message:
				s.event(ps, m.Channel, 0)
			case *redis.Subscription:
				switch m.Kind {
				case "subscribe", "ssubscribe":
					// The confirmation, or a re-subscription after go-redis
					// reconnected: a release meanwhile was unheard.
					s.event(ps, m.Channel, confirmed)
				case "sunsubscribe":
					// We never send SUNSUBSCRIBE (a sharded topic's PubSub
					// is closed instead): the server ended the
					// subscription, because its slot migrated or its
					// shard failed over.
					s.event(ps, m.Channel, lapsed)
				}
				// A classic "unsubscribe" answers our own UNSUBSCRIBE of a
				// topic gone: the server never ends a classic one itself.
			}
		}
	}()
}

// event passes what ps received for channel to its topic, if ps is still
// the topic's: to the state (confirmed or lapsed) when not 0, and as a
// wake-up to every waiter.
func (s *subscriptions) event(ps *redis.PubSub, channel string, to subState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.topics[channel]
	if t == nil || t.ps != ps {
		return
	}
	switch to {
	case confirmed:
		t.state = confirmed
		select {
		case <-t.confirmed: // confirmed before: a re-subscription
		default:
			close(t.confirmed)
		}
	case lapsed:
		t.state = lapsed
	}
	t.wakeLocked()
}

// wakeLocked wakes every waiter of t. subscriptions.mu is held.
func (t *topic) wakeLocked() {
	for w := range t.waiters {
		select {
		case w.wake <- struct{}{}:
		default: // a wake-up is pending already
		}
	}
}

// state returns the state of w's topic's subscription.
func (s *subscriptions) state(w *waiter) subState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return w.t.state
}

// close closes every PubSub and waits for the dispatch goroutines. Waiters
// still registered return on Client.closing and leave.
func (s *subscriptions) close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	var pss []*redis.PubSub
	if s.classic != nil {
		pss = append(pss, s.classic)
		s.classic = nil
	}
	for _, t := range s.topics {
		if t.sharded && t.ps != nil {
			pss = append(pss, t.ps)
		}
		t.ps = nil
		t.gone = true
	}
	s.mu.Unlock()
	for _, ps := range pss {
		_ = ps.Close()
	}
	s.wg.Wait()
}

// waitersOf returns how many waiting calls channel has (for tests).
func (c *Client) waitersOf(channel string) int {
	c.subs.mu.Lock()
	defer c.subs.mu.Unlock()
	if t := c.subs.topics[channel]; t != nil {
		return len(t.waiters)
	}
	return 0
}
