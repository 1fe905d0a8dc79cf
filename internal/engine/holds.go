package engine

import (
	"fmt"
	"strings"
	"sync"

	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/lease"
)

// Counted holds (ReentrantMutex, and both sides of RWMutex) belong to an
// owner and count its re-entries. A Core tracks each in its hold table by
// lock key and owner, and every call that changes one runs under the
// owner's gate, so that the count recorded here follows the server's: the
// results of an owner's round trips are recorded in the order the server
// applied them.

// holdTable is a Core's counted holds and its owners' gates. Lock order:
// an owner's gate, then mu (never the reverse); the watchdog's lock may be
// taken under mu.
type holdTable struct {
	mu    sync.Mutex
	holds map[string]*lease.Hold // by HoldKey(key, owner)
	gates map[string]*ownerGate  // by HoldKey (or a shared gate's name)
	// views are the Mutex engines whose slots keep a ReentrantMutex
	// owner's grant (reentrant.go), by HoldKey like its hold in holds.
	views map[string]*Mutex
}

func (t *holdTable) init() {
	t.holds = make(map[string]*lease.Hold)
	t.gates = make(map[string]*ownerGate)
	t.views = make(map[string]*Mutex)
}

// HoldKey is the key of an owner's hold on a lock in the hold table.
func HoldKey(key, owner string) string { return key + "\x00" + owner }

// heldLease returns the hold this Core tracks for hk, or nil.
func (c *Core) heldLease(hk string) *lease.Hold {
	c.holds.mu.Lock()
	defer c.holds.mu.Unlock()
	return c.holds.holds[hk]
}

// forgetHold stops tracking l under hk, if it is still the one tracked.
func (c *Core) forgetHold(hk string, l *lease.Hold) {
	c.holds.mu.Lock()
	if c.holds.holds[hk] == l {
		delete(c.holds.holds, hk)
		delete(c.holds.views, hk)
	}
	c.holds.mu.Unlock()
}

// recordGrant records l, a ReentrantMutex grant that the watchdog keeps
// already, as the owner's hold hk (count 1), kept in m's slot. A hold of
// the owner still recorded as live was lost: the key was free, or handed
// to the owner's call, while it held.
func (c *Core) recordGrant(hk string, l *lease.Hold, m *Mutex) {
	t := &c.holds
	t.mu.Lock()
	old := t.holds[hk]
	l.Count = 1
	t.holds[hk], t.views[hk] = l, m
	t.mu.Unlock()
	if old != nil && old != l {
		c.WD.Lose(&old.Lease, fmt.Errorf("%w: hold gone before the owner locked again", errs.ErrLost))
	}
}

// grantOf returns a ReentrantMutex owner's hold hk and the Mutex engine
// whose slot keeps it, or nils.
func (c *Core) grantOf(hk string) (*lease.Hold, *Mutex) {
	c.holds.mu.Lock()
	defer c.holds.mu.Unlock()
	return c.holds.holds[hk], c.holds.views[hk]
}

// trackHold records that the server now counts n holds for hk. A first hold
// (n == 1) gets the hold fresh makes; a re-entry updates the count. It
// returns false when the Core closed meanwhile: the caller must give the
// hold back.
func (c *Core) trackHold(hk string, n int64, fresh func() *lease.Hold) bool {
	t := &c.holds
	t.mu.Lock()
	old := t.holds[hk]
	if n > 1 && old != nil && c.WD.IsHeld(&old.Lease) {
		old.Count = n
		t.mu.Unlock()
		return true
	}
	l := fresh()
	l.Count = n
	t.holds[hk] = l
	t.mu.Unlock()
	if old != nil {
		// The server had no hold for the owner although this Core still
		// tracked one: that hold was lost, and its holder must hear of it.
		c.WD.Lose(&old.Lease, fmt.Errorf("%w: hold gone before the owner locked again", errs.ErrLost))
	}
	if !c.WD.Add(&l.Lease) {
		// Closed: nothing keeps the hold. Forget it, so that Lost and
		// HoldContext do not report a hold that nothing keeps.
		c.forgetHold(hk, l)
		return false
	}
	return true
}

// HoldsOn returns the counted holds this Core tracks on the lock of key,
// whoever their owner: what a ForceUnlock about to run can take. (Taken
// before the force: a hold granted after it, once it has run, is not the
// force's to report lost.)
func (c *Core) HoldsOn(key string) []*lease.Hold {
	prefix := HoldKey(key, "")
	var ls []*lease.Hold
	c.holds.mu.Lock()
	for hk, l := range c.holds.holds {
		if strings.HasPrefix(hk, prefix) {
			ls = append(ls, l)
		}
	}
	c.holds.mu.Unlock()
	return ls
}

// LoseHolds reports ls lost, with cause (a ForceUnlock's).
func (c *Core) LoseHolds(ls []*lease.Hold, cause error) {
	for _, l := range ls {
		c.WD.Lose(&l.Lease, cause)
	}
}

// grantsOf returns the ReentrantMutex holds this Core records on the lock
// of key under the grant id, whoever their owner.
func (c *Core) grantsOf(key, id string) []*lease.Hold {
	prefix := HoldKey(key, "")
	var ls []*lease.Hold
	c.holds.mu.Lock()
	for hk, m := range c.holds.views {
		if l := c.holds.holds[hk]; m != nil && l != nil && l.Spec.ID == id && strings.HasPrefix(hk, prefix) {
			ls = append(ls, l)
		}
	}
	c.holds.mu.Unlock()
	return ls
}

// ownerGate orders the calls of one owner on one lock through this Core.
type ownerGate struct {
	mu   sync.Mutex
	refs int // guarded by holdTable.mu
}

// Gate locks the gate called name and returns its unlock.
func (c *Core) gate(name string) (unlock func()) {
	t := &c.holds
	t.mu.Lock()
	g := t.gates[name]
	if g == nil {
		g = &ownerGate{}
		t.gates[name] = g
	}
	g.refs++
	t.mu.Unlock()
	g.mu.Lock()
	return func() {
		g.mu.Unlock()
		t.mu.Lock()
		if g.refs--; g.refs == 0 {
			delete(t.gates, name)
		}
		t.mu.Unlock()
	}
}
