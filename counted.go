package dlock

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/dlock-go/dlock/internal/lease"
	"github.com/dlock-go/dlock/internal/telemetry"
	"github.com/dlock-go/dlock/internal/wire"
)

// Counted holds (ReentrantMutex, and both sides of RWMutex) belong to an
// owner and count its re-entries. This Client tracks each in Client.holds by
// lock key and owner, and every call that changes one runs under the owner's
// gate, so that the count recorded here follows the server's: the results of
// an owner's round trips are recorded in the order the server applied them.

// countedOps is what one side of a counted primitive supplies: its scripts.
type countedOps interface {
	// tryScript runs the acquire script for owner, queueing as waiter when
	// markTTL > 0 and the try is refused.
	tryScript(ctx context.Context, owner, waiter string, ttl, markTTL time.Duration) (wire.Try, error)
	// serverCount reads the owner's hold count on the server.
	serverCount(ctx context.Context, owner string) (int64, error)
	// releaseScript drops one of the owner's holds and wakes whom its
	// release lets through; it returns the owner's remaining holds (-1: it
	// held none).
	releaseScript(ctx context.Context, owner string) (int64, error)
	// leaveQueue withdraws a waiting owner from the queue, passing on a lock
	// handed to it that it has not claimed.
	leaveQueue(ctx context.Context, owner, waiter string)
}

// counted is one owner's hold on one side of a counted primitive, as a call
// acquiring or releasing it sees it. It is the acquirer of its acquisitions.
type counted struct {
	h     *handle
	ops   countedOps
	owner string
	hk    string // the hold's key in Client.holds
	gate  string // the owner's gate; both sides of an RWMutex share one
	// Where the hold's lease is kept, for the watchdog.
	leaseKey string
	extra    []string
	spec     byte
	// Where a queued owner's place is kept.
	waiter    string // the owner as it queues
	markKey   string
	markExtra []string
	markSpec  wire.Spec
}

func holdKey(key, owner string) string { return key + "\x00" + owner }

func (k *counted) try(a *acquisition) (bool, time.Duration, error) {
	c := k.h.c
	defer c.gate(k.gate)()
	markTTL := a.sending()
	r, err := k.ops.tryScript(a.tryCtx(), k.owner, k.waiter, a.ttl, markTTL)
	if err != nil {
		if outcomeUnknown(err) {
			k.reconcile(a.nc)
			if markTTL > 0 {
				k.ops.leaveQueue(a.nc, k.owner, k.waiter) // the lost reply may have queued the owner
			}
		}
		return false, 0, k.h.fail(a.op, err)
	}
	if !r.Held {
		return a.refused(r.Holder, r.Left, markTTL > 0, r.Queued, k.markKey, k.markExtra, k.markSpec)
	}
	return a.granted(func() error {
		if r.Count == 1 {
			if err := a.fresh(); err != nil {
				return err
			}
		}
		fresh := func() *lease.Hold {
			l := a.newHold(k.leaseKey, wire.Spec{Kind: k.spec, ID: k.owner})
			l.Extra, l.Token = k.extra, r.Token
			return l
		}
		if !c.trackHold(k.hk, r.Count, fresh) {
			return closedErr(a.op, k.h.name)
		}
		if r.Count == 1 {
			c.waits.WakeOwner(k.h.channel, k.owner) // the owner's other waiters re-enter
			telemetry.Annotate(a.ctx, telemetry.AttrToken.Int64(int64(r.Token)))
		}
		telemetry.Annotate(a.ctx, telemetry.AttrHoldCount.Int64(r.Count))
		return nil
	})
}

func (k *counted) giveBack(a *acquisition) { _, _ = k.ops.releaseScript(a.nc, k.owner) }

// leave withdraws a waiting owner from the queue, unless another call of the
// same owner on this Client still waits there: they share the owner's place.
func (k *counted) leave(a *acquisition) {
	if !k.h.c.waits.HasOwner(k.h.channel, k.owner) {
		k.ops.leaveQueue(a.nc, k.owner, k.waiter)
	}
}

// holderCount reads owner's hold count from a primitive's main key, whose
// fields 'o' and 'n' name the holder and count its holds: 0 when another
// owner holds it, or nobody.
func holderCount(ctx context.Context, c *Client, key, owner string) (int64, error) {
	v, err := c.rdb.HMGet(ctx, key, "o", "n").Result()
	if err != nil {
		return 0, err
	}
	if holder, _ := v[0].(string); holder != owner {
		return 0, nil
	}
	n, _ := v[1].(string)
	return strconv.ParseInt(n, 10, 64)
}

// reconcile runs after an acquisition whose reply was lost. If the server
// counts one hold more than this Client knew of, the attempt went through;
// since the caller gets an error, that hold is given back. The owner's gate
// is held and only this Client writes the owner's count, so the difference
// can only come from that attempt.
func (k *counted) reconcile(ctx context.Context) {
	var known int64
	if l := k.h.c.heldLease(k.hk); l != nil {
		known = l.Count
	}
	if cur, err := k.ops.serverCount(ctx, k.owner); err == nil && cur == known+1 {
		_, _ = k.ops.releaseScript(ctx, k.owner)
	}
}

// release drops one of the owner's holds (Unlock, RUnlock).
func (k *counted) release(ctx context.Context, op string) error {
	c := k.h.c
	defer c.gate(k.gate)()
	l := c.heldLease(k.hk)
	if l != nil {
		if err := k.h.lostAlready(op, l); err != nil {
			c.forgetHold(k.hk, l)
			return err
		}
	}
	k.h.beginRelease(l)
	n, err := k.ops.releaseScript(detach(ctx), k.owner)
	if err != nil {
		err = k.h.fail(op, err)
	}
	if err == nil && n <= 0 && l != nil {
		c.forgetHold(k.hk, l)
	}
	return k.h.settleRelease(op, l, n, err, false)
}

// lease returns the hold this Client tracks for the owner, or nil.
func (k *counted) lease() *lease.Hold { return k.h.c.heldLease(k.hk) }

// heldLease returns the hold this Client tracks for hk, or nil.
func (c *Client) heldLease(hk string) *lease.Hold {
	c.holdsMu.Lock()
	defer c.holdsMu.Unlock()
	return c.holds[hk]
}

// forgetHold stops tracking l under hk, if it is still the one tracked.
func (c *Client) forgetHold(hk string, l *lease.Hold) {
	c.holdsMu.Lock()
	if c.holds[hk] == l {
		delete(c.holds, hk)
	}
	c.holdsMu.Unlock()
}

// trackHold records that the server now counts n holds for hk. A first hold
// (n == 1) gets the hold fresh makes; a re-entry updates the count. It
// returns false when the Client closed meanwhile: the caller must give the
// hold back.
func (c *Client) trackHold(hk string, n int64, fresh func() *lease.Hold) bool {
	c.holdsMu.Lock()
	old := c.holds[hk]
	if n > 1 && old != nil && c.wd.IsHeld(&old.Lease) {
		old.Count = n
		c.holdsMu.Unlock()
		return true
	}
	l := fresh()
	l.Count = n
	c.holds[hk] = l
	c.holdsMu.Unlock()
	if old != nil {
		// The server had no hold for the owner although this Client still
		// tracked one: that hold was lost, and its holder must hear of it.
		c.wd.Lose(&old.Lease, fmt.Errorf("%w: hold gone before the owner locked again", ErrLost))
	}
	if !c.wd.Add(&l.Lease) {
		// Closed: nothing keeps the hold. Forget it, so that Lost and
		// HoldContext do not report a hold that nothing keeps.
		c.forgetHold(hk, l)
		return false
	}
	return true
}

// ownerGate orders the calls of one owner on one lock through this Client.
type ownerGate struct {
	mu   sync.Mutex
	refs int // guarded by Client.holdsMu
}

// gate locks the gate of key and returns its unlock.
func (c *Client) gate(key string) (unlock func()) {
	c.holdsMu.Lock()
	g := c.gates[key]
	if g == nil {
		g = &ownerGate{}
		c.gates[key] = g
	}
	g.refs++
	c.holdsMu.Unlock()
	g.mu.Lock()
	return func() {
		g.mu.Unlock()
		c.holdsMu.Lock()
		if g.refs--; g.refs == 0 {
			delete(c.gates, key)
		}
		c.holdsMu.Unlock()
	}
}
