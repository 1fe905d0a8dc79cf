package dlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/internal/engine"
	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/lease"
)

// MultiLock holds several locks at once, all or none, as Redisson's
// MultiLock and redislock's ObtainMulti do. It is one Mutex per name, so
// each member keeps what a Mutex has: its own key (the names may hash to
// different Redis Cluster slots and nodes), a queue served in arrival order,
// a fencing token, and the watchdog's renewals (or a WithLease lease).
//
// The members are taken one by one in a total order, the names sorted, and
// released in reverse. Since every MultiLock takes its names in the same
// order, two of them whose name sets overlap cannot deadlock, whatever order
// their callers listed the names in. The price: a Lock that waits for a
// later member goes on holding the earlier ones, so callers that want only
// those earlier locks wait too; and Lock costs a round trip per member.
// Keep name sets small, and do not mix a MultiLock with code that takes the
// same locks one by one in another order.
//
// Like a Mutex handle, a MultiLock handle may be shared by goroutines,
// which then exclude each other, and any goroutine may Unlock what another
// locked. Make one with Client.MultiLock. The zero MultiLock is not usable.
type MultiLock struct {
	names   []string // sorted, without duplicates
	members []*Mutex // one per name, in the same order
	lease   time.Duration
	err     error

	mu   sync.Mutex
	hold *multiHold // the group's current hold, nil when not held
}

// multiHold is one hold of the whole group.
type multiHold struct {
	tokens map[string]uint64
	lost   chan struct{} // closed when any member is lost
	once   sync.Once
	done   atomic.Bool // the group hold ended: a member's loss no longer counts

	ctxs lease.Contexts // the group's hold contexts
}

// MultiLock returns a handle that holds the locks called names together.
// Duplicates count once; the order of names does not matter. It sends
// nothing to Redis. The options apply to every member (WithLease: see
// Lock). No names, an empty name or an invalid option makes every method
// return an error wrapping ErrInvalid.
func (c *Client) MultiLock(names []string, opts ...LockOption) *MultiLock {
	sorted := slices.Clone(names)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	ml := &MultiLock{names: sorted, lease: buildLockConfig(opts).lease}
	if len(sorted) == 0 {
		ml.err = errs.Invalidf("multilock with no names")
	}
	for _, n := range sorted {
		m := c.Mutex(n, opts...)
		if ml.err == nil && m.h.Err != nil {
			ml.err = m.h.Err
		}
		ml.members = append(ml.members, m)
	}
	return ml
}

// Names returns the members' names, sorted: the order in which Lock takes
// them.
func (ml *MultiLock) Names() []string { return slices.Clone(ml.names) }

// usable reports the error every call returns before touching Redis.
func (ml *MultiLock) usable(ctx context.Context, op string) error {
	if ml.err != nil {
		return errs.Op(op, ml.label(), "", ml.err)
	}
	return ml.members[0].h.Usable(ctx)
}

// label names the group in errors.
func (ml *MultiLock) label() string {
	return fmt.Sprint(ml.names)
}

// Lock blocks until it holds every member, ctx ends, or the Client closes.
// It takes the members in name order, each as Mutex.Lock does (queued in
// Redis, woken without polling).
//
// When it fails midway (ctx ended, Redis could not be reached), it releases
// the members it had taken, in reverse order, and returns the member's
// error: when ctx ended, it matches ErrNotObtained and ctx.Err(). Nothing is
// then held. If a member is lost while Lock waits for a later one (its
// WithLease lease ran out, its key was deleted), Lock gives everything back
// and starts again.
//
// With WithLease, each member's lease starts when it is taken; once it has
// them all, Lock extends the earlier ones (a round trip each) so that every
// member's lease runs from then.
func (ml *MultiLock) Lock(ctx context.Context) error {
	if err := ml.usable(ctx, "lock"); err != nil {
		return err
	}
	for {
		ok, err := ml.acquire(ctx, true)
		if ok || err != nil {
			return err
		}
		// A member was lost before the group was complete: try again.
		if ctx.Err() != nil {
			return errs.NotObtained("lock", ml.label(), ctx)
		}
	}
}

// TryLock takes every member if each is free and nobody queues for it, and
// reports whether it did: one round trip per member, up to the first that
// is taken. It never leaves some members held: finding one taken (false,
// nil) or failing, it releases those it took, in reverse order.
func (ml *MultiLock) TryLock(ctx context.Context) (bool, error) {
	if err := ml.usable(ctx, "trylock"); err != nil {
		return false, err
	}
	return ml.acquire(ctx, false)
}

// acquire takes every member in order, blocking or not. It reports false
// with no error when a member was taken (TryLock) or lost before the group
// was complete; then nothing is held.
func (ml *MultiLock) acquire(ctx context.Context, block bool) (bool, error) {
	taken := 0
	giveBack := func() {
		for i := taken - 1; i >= 0; i-- {
			_ = ml.members[i].Unlock(engine.Detach(ctx))
		}
	}
	for _, m := range ml.members {
		var err error
		ok := true
		if block {
			err = m.Lock(ctx)
		} else {
			ok, err = m.TryLock(ctx)
		}
		if err != nil || !ok {
			giveBack()
			return false, err
		}
		taken++
	}
	if ml.lease > 0 && len(ml.members) > 1 {
		for _, m := range ml.members[:taken-1] {
			if err := m.Extend(ctx, ml.lease); err != nil {
				giveBack()
				if errors.Is(err, ErrLost) || errors.Is(err, ErrNotHeld) {
					return false, nil
				}
				return false, err
			}
		}
	}
	for _, m := range ml.members {
		if !m.leads() {
			giveBack()
			return false, nil
		}
	}
	ml.keep()
	return true, nil
}

// keep records the group hold just taken, and watches each member's hold
// so that the loss of one is the group's. The group's hold contexts are
// cancelled, and then its Lost closes, at the moment the member's Lost
// closes, on the same goroutine: a member lost at its deadline makes the
// group lost at its deadline too.
func (ml *MultiLock) keep() {
	g := &multiHold{tokens: make(map[string]uint64, len(ml.members)), lost: make(chan struct{})}
	for _, m := range ml.members {
		g.tokens[m.h.Name] = m.Token()
		l := m.slot.Get()
		name := m.h.Name
		lostNow := func(cause error) {
			if g.done.Load() {
				return
			}
			// The hold contexts first: whoever Lost wakes finds them done.
			g.ctxs.End(fmt.Errorf("%w (member %q)", cause, name))
			g.once.Do(func() { close(g.lost) })
		}
		if l == nil || !m.h.C.WD.WhenLost(l, lostNow) {
			lostNow(fmt.Errorf("%w: member ended before the group was held", ErrLost))
		}
	}
	ml.mu.Lock()
	old := ml.hold
	ml.hold = g
	ml.mu.Unlock()
	if old != nil {
		// Every member was free, so the older group hold was lost.
		old.end(fmt.Errorf("%w: lease ran out before a new Lock on the handle", ErrLost))
	}
}

// end ends the group hold with cause; a member lost later changes nothing.
func (g *multiHold) end(cause error) {
	g.done.Store(true)
	g.ctxs.End(cause)
	if errors.Is(cause, ErrLost) {
		g.once.Do(func() { close(g.lost) })
	}
}

// Unlock releases every member, in reverse name order, each as Mutex.Unlock
// does (the first caller queued for it gets it). It tries every member even
// when some fail, and returns their errors joined: ErrLost for a member
// lost before Unlock, which the others' release does not undo. It returns
// an error matching ErrNotHeld when the handle holds nothing. Either way
// the group hold has ended: a member whose release failed in transit is no
// longer renewed, and ends by its lease at the latest (see Mutex.Unlock).
func (ml *MultiLock) Unlock(ctx context.Context) error {
	if err := ml.usable(ctx, "unlock"); err != nil {
		return err
	}
	ml.mu.Lock()
	g := ml.hold
	ml.hold = nil
	ml.mu.Unlock()
	if g == nil {
		return errs.Op("unlock", ml.label(), "", ErrNotHeld)
	}
	g.end(lease.ErrReleased)
	var errs []error
	for i := len(ml.members) - 1; i >= 0; i-- {
		if err := ml.members[i].Unlock(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Lost returns a channel that is closed when any member of the current
// group hold is lost (see Mutex.Lost). Unlock does not close it. It returns
// nil (a channel that never fires) when the handle holds nothing.
func (ml *MultiLock) Lost() <-chan struct{} {
	ml.mu.Lock()
	defer ml.mu.Unlock()
	if ml.hold == nil {
		return nil
	}
	return ml.hold.lost
}

// HoldContext returns a copy of parent that is cancelled when the group
// hold ends: by Unlock, or by the loss of any member, in which case
// context.Cause reports an error matching ErrLost that names the member,
// and it is cancelled before Lost closes. Without a hold it is already
// cancelled, with cause ErrNotHeld. Call the CancelFunc when done.
func (ml *MultiLock) HoldContext(parent context.Context) (context.Context, context.CancelFunc) {
	ml.mu.Lock()
	g := ml.hold
	ml.mu.Unlock()
	if g == nil {
		ctx, cancel := context.WithCancelCause(parent)
		cancel(ErrNotHeld)
		return ctx, func() {}
	}
	return g.ctxs.Derive(parent)
}

// Token returns the fencing token of the member called name in the current
// group hold (see Mutex.Token), or 0 when the handle holds nothing or name
// is not a member.
func (ml *MultiLock) Token(name string) uint64 {
	ml.mu.Lock()
	defer ml.mu.Unlock()
	if ml.hold == nil {
		return 0
	}
	return ml.hold.tokens[name]
}

// Tokens returns the fencing token of every member of the current group
// hold, by name, or nil when the handle holds nothing.
func (ml *MultiLock) Tokens() map[string]uint64 {
	ml.mu.Lock()
	defer ml.mu.Unlock()
	if ml.hold == nil {
		return nil
	}
	out := make(map[string]uint64, len(ml.hold.tokens))
	for n, t := range ml.hold.tokens {
		out[n] = t
	}
	return out
}
