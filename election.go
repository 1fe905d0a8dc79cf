package dlock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/dlock-go/dlock/internal/engine"
	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/scripts"
	"github.com/dlock-go/dlock/internal/telemetry"
	"github.com/dlock-go/dlock/internal/wait"
	"github.com/dlock-go/dlock/internal/wire"
)

// Election elects one leader among campaigners, across processes, as etcd's
// concurrency.Election does, on dlock's machinery: the leader holds an
// exclusive lock of its own kind ("election"), renewed by the watchdog (or
// for a WithLease lease), with a fencing token per term; campaigners wait
// in its queue in Redis and are served in arrival order, woken by pub/sub;
// the leader's value lives in the lock's key, so it expires with the lease.
//
// Make one with Client.Election. One Election handle campaigns for one
// leadership at a time; use one handle per candidate. Its methods are safe
// for concurrent use.
type Election struct {
	m *Mutex

	mu    sync.Mutex // orders Campaign and Resign on the handle
	value string     // the value the handle's leadership proclaimed
}

// Election returns a handle on the election called name. It sends nothing
// to Redis. WithLease fixes the leader's lease instead of the watchdog's
// renewals. An empty name or an invalid option makes every method return an
// error wrapping ErrInvalid.
func (c *Client) Election(name string, opts ...LockOption) *Election {
	return &Election{m: c.newMutex(telemetry.KindElection, name, opts)}
}

// Name returns the election's name, without the key prefix.
func (e *Election) Name() string { return e.m.h.Name }

// Campaign blocks until the handle is the leader, ctx ends, or the Client
// closes; then it publishes value, which must not be empty, as the leader's,
// which Leader returns and Observe delivers. Uncontended it costs two round trips: one to take the
// leadership, one to publish the value and notify observers.
//
// When ctx ends first, it returns an error matching ErrNotObtained and
// ctx.Err(), and leaves nothing behind. A handle that already leads
// publishes the new value and returns at once (as etcd's Proclaim does).
// The leadership lasts until Resign, or until it is lost (see Lost).
func (e *Election) Campaign(ctx context.Context, value string) error {
	if value == "" {
		// Leader would return "" for it, which reads as nobody's value.
		return errs.Op("campaign", e.m.h.Name, "an empty value", ErrInvalid)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	m := e.m
	if !m.leads() {
		if err := m.lock(ctx, "dlock.Election.Campaign", "campaign"); err != nil {
			return err
		}
	}
	if err := e.proclaim(ctx, value); err != nil {
		_ = m.unlock(context.WithoutCancel(ctx), "dlock.Election.Resign", "resign")
		return err
	}
	e.value = value
	return nil
}

// leads reports whether the handle holds its lock and has not lost it.
func (m *Mutex) leads() bool {
	l := m.slot.Get()
	return l != nil && m.h.C.WD.IsHeld(&l.Lease)
}

// proclaim publishes value as the handle's leadership's.
func (e *Election) proclaim(ctx context.Context, value string) error {
	m := e.m
	l := m.slot.Get()
	if l == nil {
		return errs.Op("campaign", m.h.Name, "", ErrLost)
	}
	c := m.h.C
	ok, err := c.Script(engine.Detach(ctx), scripts.ElectionProclaim, []string{m.h.Keys[0], m.h.Keys[1], m.h.Channel}, l.Spec.ID, value, c.ID).Int()
	if err != nil {
		return m.h.Fail("campaign", err)
	}
	if ok != 1 {
		c.WD.Lose(&l.Lease, fmt.Errorf("%w: leadership gone before its value was published", ErrLost))
		return errs.Op("campaign", m.h.Name, "", ErrLost)
	}
	// This Client's own observers: the notice it published is ignored here.
	c.Waits.Wake(m.h.Channel, wire.Wake{Kind: wire.KindObserver}, wait.WakeRelease)
	return nil
}

// Resign gives the leadership up, handing it to the next campaigner queued,
// if any. It returns an error matching ErrNotHeld when the handle does not
// lead, and ErrLost when its leadership was lost before.
func (e *Election) Resign(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.m.unlock(ctx, "dlock.Election.Resign", "resign")
}

// Leader returns the current leader's value, in one round trip. It returns
// an error matching ErrNoLeader when nobody leads (or the leader elected a
// moment ago has not yet published its value).
func (e *Election) Leader(ctx context.Context) (string, error) {
	li, err := e.leader(ctx)
	if err != nil {
		return "", err
	}
	if li.id == "" {
		return "", errs.Op("leader", e.m.h.Name, "", ErrNoLeader)
	}
	return li.value, nil
}

// leaderInfo is the leader as internal/scripts/election_leader.lua reports it; id
// is "" when there is none.
type leaderInfo struct {
	id, value string
	left      time.Duration
	token     uint64
}

func (e *Election) leader(ctx context.Context) (leaderInfo, error) {
	m := e.m
	if err := m.h.Usable(ctx); err != nil {
		return leaderInfo{}, err
	}
	res, err := m.h.C.Script(ctx, scripts.ElectionLeader, m.h.Keys[:1]).Slice()
	if err != nil {
		return leaderInfo{}, m.h.Fail("leader", err)
	}
	var li leaderInfo
	if len(res) == 4 {
		li.id, _ = res[0].(string)
		li.value, _ = res[1].(string)
		ms, _ := res[2].(int64)
		li.left = time.Duration(ms) * time.Millisecond
		token, _ := res[3].(string)
		li.token, _ = strconv.ParseUint(token, 10, 64)
	}
	return li, nil
}

// Observe returns a channel that delivers the value of each new leader
// (each term, and each value a leader publishes anew), starting with the
// current one, if any, until ctx ends or the Client closes; then it is
// closed, even if nobody reads it. It does not poll: it is woken by the
// notice each new leader publishes, and looks again when its subscription
// to those notices is confirmed (at first, and after every reconnect, since
// a notice may have been missed meanwhile), when the leader's lease ends (a
// leader that died), or every so often while nobody leads. Values are
// delivered in order; a slow reader delays the next one, and never misses
// the latest.
func (e *Election) Observe(ctx context.Context) <-chan string {
	out := make(chan string)
	if e.m.h.Usable(ctx) != nil {
		close(out)
		return out
	}
	go e.observe(ctx, out)
	return out
}

// observe runs an Observe, waiting as internal/wait's protocol does, as an
// observer: only a new leader's notice wakes it, and the subscription's
// confirmation (first, and after every reconnect, since a notice may have
// been missed meanwhile), and the Client's close, which ends it even while
// it waits for its reader. No release's wake-up, meant for campaigners,
// ever picks it.
func (e *Election) observe(ctx context.Context, out chan<- string) {
	defer close(out)
	m, c := e.m, e.m.h.C
	w, err := c.Waits.Join(m.h.Channel, wait.As{Kind: wire.KindObserver})
	if err != nil {
		return
	}
	defer c.Waits.Leave(w, true) // a notice wakes every observer: nothing to pass on
	sctx, cancel := context.WithTimeout(engine.Detach(ctx), wait.SubscribeTimeout)
	_, err = c.Hub().Acquire(sctx, m.h.Channel)
	cancel()
	if err != nil {
		return
	}
	defer c.Hub().Release(m.h.Channel)
	c.Tel.Waiters(1, telemetry.KindElection+"_observer", m.h.Name)
	defer c.Tel.Waiters(-1, telemetry.KindElection+"_observer", m.h.Name)

	o := observer{e: e, ctx: ctx, out: out, w: w, timer: time.NewTimer(time.Hour)}
	defer o.timer.Stop()
	for {
		// A wake-up that comes during the look is kept for the next one;
		// the Client's close is never consumed here.
		c.Waits.Attempt(w)
		next, woken, ok := o.look()
		if !ok {
			return
		}
		if !woken && !o.sleep(next) {
			return
		}
	}
}

// observer is one Observe's state between its looks.
type observer struct {
	e      *Election
	ctx    context.Context
	out    chan<- string
	w      *wait.Waiter // its place in the Client's registry of waiters
	timer  *time.Timer
	last   leaderInfo // the leader last delivered
	looked int        // looks so far, for the wake-up events
}

// look reads the leader and delivers it if it is new. It returns when to
// look again at the latest, whether a wake-up came while it waited for the
// reader (then it must look again at once), and false when the Observe
// ends.
func (o *observer) look() (next time.Duration, woken, ok bool) {
	c := o.e.m.h.C
	o.looked++
	li, err := o.e.leader(engine.Detach(o.ctx))
	switch {
	case errors.Is(err, ErrClosed):
		return 0, false, false
	case err != nil || li.id == "":
		return c.MarkLease(), false, true // nobody leads, or Redis unreachable: look again after a while
	case li.id == o.last.id && li.value == o.last.value:
		return c.Loop.RetryAfter(li.left), false, true
	}
	for {
		select {
		case o.out <- li.value:
			o.last = li
			return c.Loop.RetryAfter(li.left), woken, true
		case <-o.ctx.Done():
			return 0, false, false
		case why := <-o.w.C():
			woken = true
			if why == wait.WakeClosed {
				return 0, false, false
			}
		}
	}
}

// sleep waits for a wake-up, or for d, and reports false when the Observe
// ends instead.
func (o *observer) sleep(d time.Duration) bool {
	c := o.e.m.h.C
	at := time.Now().Add(d)
	o.timer.Reset(d)
	for {
		select {
		case why := <-o.w.C():
			if why == wait.WakeRetime {
				// The lock changed hands: look again when the new hold
				// ends, if that comes first.
				if r := c.Waits.Retimed(o.w).Add(time.Millisecond); r.Before(at) {
					at = r
					o.timer.Reset(time.Until(at))
				}
				continue
			}
			if why == wait.WakeClosed {
				return false
			}
			telemetry.WokeUp(o.ctx, why.String(), o.looked+1)
		case <-o.timer.C:
			telemetry.WokeUp(o.ctx, "timer", o.looked+1)
		case <-o.ctx.Done():
			return false
		}
		return true
	}
}

// Token returns the fencing token of the handle's leadership (its term), or
// 0 when it does not lead. Each term's token is greater than every earlier
// term's (see Mutex.Token).
func (e *Election) Token() uint64 { return e.m.Token() }

// Lost returns a channel that is closed if the handle's leadership is lost
// (see Mutex.Lost), or nil when it does not lead.
func (e *Election) Lost() <-chan struct{} { return e.m.Lost() }

// HoldContext returns a copy of parent that is cancelled when the handle's
// leadership ends: by Resign, or by loss (see Mutex.HoldContext).
func (e *Election) HoldContext(parent context.Context) (context.Context, context.CancelFunc) {
	return e.m.HoldContext(parent)
}

// Status reads the election in one round trip (see Mutex.Status).
func (e *Election) Status(ctx context.Context) (Status, error) {
	return readStatus(ctx, e.m.h, "status", telemetry.KindElection)
}
