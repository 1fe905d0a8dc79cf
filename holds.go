package dlock

import (
	"context"
	"fmt"
)

// Counted holds (ReentrantMutex, and both sides of RWMutex) are tracked per
// lock key and owner, in Client.holds. Every call that changes one runs under
// the owner's gate (Client.gate), so the count recorded here follows the
// server's.

// heldLease returns the lease this Client tracks for hk, or nil.
func (c *Client) heldLease(hk string) *lease {
	c.holdsMu.Lock()
	defer c.holdsMu.Unlock()
	return c.holds[hk]
}

// trackHold records that the server now counts n holds for hk. A first hold
// (n == 1) gets the lease fresh makes; a re-entry updates the count. It
// returns false when the Client closed meanwhile: the caller must give the
// hold back.
func (c *Client) trackHold(hk string, n int64, fresh func() *lease) bool {
	l, ok := c.recordHold(hk, n, fresh)
	if !ok {
		// Closed: the lease was never watched. Forget it, so that Lost and
		// HoldContext do not report a hold that nothing keeps.
		c.holdsMu.Lock()
		if c.holds[hk] == l {
			delete(c.holds, hk)
		}
		c.holdsMu.Unlock()
	}
	return ok
}

func (c *Client) recordHold(hk string, n int64, fresh func() *lease) (*lease, bool) {
	c.holdsMu.Lock()
	old := c.holds[hk]
	if n > 1 && old != nil && c.wd.isHeld(old) {
		old.count = n
		c.holdsMu.Unlock()
		return old, true
	}
	l := fresh()
	l.count = n
	c.holds[hk] = l
	c.holdsMu.Unlock()
	if old != nil {
		// The server had no hold for the owner although this Client still
		// tracked one: that hold was lost, and its holder must hear of it.
		c.wd.lose(old, fmt.Errorf("%w: hold gone before the owner locked again", ErrLost))
	}
	return l, c.wd.add(l)
}

// reconcile runs after an acquisition whose reply was lost. If the server
// counts one hold more than this Client knew of, the attempt went through;
// since the caller gets an error, undo gives that hold back. The owner's gate
// is held and only this Client writes the owner's count, so the difference
// can only come from that attempt.
func (c *Client) reconcile(ctx context.Context, hk string, serverCount func(context.Context) (int64, error), undo func(context.Context)) {
	var known int64
	if l := c.heldLease(hk); l != nil {
		known = l.count
	}
	if cur, err := serverCount(ctx); err == nil && cur == known+1 {
		undo(ctx)
	}
}

// beginUnlock marks the hold of hk as being released and returns its lease
// (nil when untracked). Pair it with finishUnlock.
func (c *Client) beginUnlock(hk string) *lease {
	l := c.heldLease(hk)
	if l != nil {
		c.wd.beginRelease(l)
	}
	return l
}

// finishUnlock records the outcome of a release script for hk: err when it
// failed to run, else n, the owner's remaining holds (-1: it held none).
func (c *Client) finishUnlock(op, name, hk string, l *lease, n int64, err error) error {
	if err != nil {
		if l != nil {
			c.wd.abortRelease(l)
		}
		return err
	}
	if n > 0 {
		if l == nil {
			return nil
		}
		c.wd.abortRelease(l) // still held: renewals go on
		l.count = n
		if cause := c.wd.lostCause(l); cause != nil {
			return fmt.Errorf("dlock: %s %q: %w", op, name, cause)
		}
		return nil
	}
	if l != nil {
		c.holdsMu.Lock()
		if c.holds[hk] == l {
			delete(c.holds, hk)
		}
		c.holdsMu.Unlock()
	}
	switch {
	case n < 0 && l == nil:
		return fmt.Errorf("dlock: %s %q: %w", op, name, ErrNotHeld)
	case n < 0:
		c.wd.lose(l, fmt.Errorf("%w: hold gone at unlock", ErrLost))
		return fmt.Errorf("dlock: %s %q: %w: %w", op, name, ErrLost, ErrNotHeld)
	case l != nil:
		if cause := c.wd.released(l); cause != nil {
			return fmt.Errorf("dlock: %s %q: %w", op, name, cause)
		}
	}
	return nil
}
