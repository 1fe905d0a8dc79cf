package dlock

// The Redlock Mutex's calls other than acquiring: Unlock, Extend, IsLocked,
// TTL and ForceUnlock, each run on every master at once.

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/dlock-go/dlock/internal/wait"

	"github.com/dlock-go/dlock/internal/lease"
	"github.com/dlock-go/dlock/internal/wire"

	"github.com/dlock-go/dlock/internal/scripts"
)

// unlock releases hold l on every master.
func (rm *rlMutex) unlock(ctx context.Context, l *lease.Hold) error {
	m, r := rm.m, rm.r
	m.beginRelease(l)
	// Masters that answer the try from now on give their grant back
	// themselves; those that answered already are released below.
	rm.abandon(l.Spec.ID)
	released, failed, lastErr := rm.onEvery(func(ctx context.Context, n *rlNode) (bool, error) {
		return rm.releaseCtx(ctx, n, l.Spec.ID)
	})
	if released > 0 {
		// This Redlock ignores its own release messages; it records the
		// release itself, for its waiters' tries at a lagging gate.
		r.firstSeen(l.Spec.ID)
		r.c.waits.Wake(rm.keys[2], wire.WakeOne, wait.WakeLocal)
	}
	switch {
	case released == 0 && failed > 0:
		err := m.fail("unlock", lastErr)
		m.mu.Lock()
		if m.hold == nil {
			m.hold = l // let the caller retry
		}
		m.mu.Unlock()
		return m.settleRelease("unlock", l, 0, err, false)
	case released == 0:
		return m.settleRelease("unlock", l, -1, nil, false)
	}
	return m.settleRelease("unlock", l, 0, nil, false)
}

// extend runs Extend on every master: applied when a quorum applied it.
func (rm *rlMutex) extend(ctx context.Context, spanName string, l *lease.Hold, d time.Duration) error {
	m, r := rm.m, rm.r
	return m.extendBy(ctx, spanName, l, d, func(context.Context) (lease.ExtendOutcome, error) {
		type got struct {
			ok  bool
			err error
		}
		res, answered := fanOut(r, context.Background(), rm.nodeTimeout(), func(ctx context.Context, n *rlNode) got {
			v, err := scripts.Renew.Run(ctx, n.rdb, []string{l.Key}, millis(d), l.Arg).Int64Slice()
			return got{err == nil && len(v) == 1 && v[0] == 1, err}
		})
		var applied []*rlNode
		var fails int
		var lastErr error
		for i, g := range res {
			switch {
			case !answered[i]:
				fails++
				lastErr = errNodeTimeout
			case g.err != nil:
				fails++
				lastErr = g.err
			case g.ok:
				applied = append(applied, r.nodes[i])
			}
		}
		switch ones := len(applied); {
		case ones >= r.quorum:
			return lease.ExtendApplied, nil
		case ones+fails < r.quorum:
			// The masters that applied the new d would keep the key
			// for it, for a hold that is over: give it back there.
			var wg sync.WaitGroup
			for _, n := range applied {
				wg.Go(func() { _, _ = rm.release(n, l.Spec.ID) })
			}
			wg.Wait()
			return lease.ExtendGone, nil
		}
		return lease.ExtendUnknown, m.fail("extend", fmt.Errorf("%w: %w", errNoQuorum, lastErr))
	})
}

// rlState is one master's view of the lock.
type rlState struct {
	holder string
	left   time.Duration
}

// state reads the lock on every master and returns the holder a quorum
// agrees on ("" when none) and what its lease has left on the quorum (the
// quorum-th longest).
func (rm *rlMutex) state(ctx context.Context, op string) (string, time.Duration, error) {
	m, r := rm.m, rm.r
	if err := m.usable(ctx); err != nil {
		return "", 0, err
	}
	type got struct {
		s   rlState
		err error
	}
	res, answered := fanOut(r, detach(ctx), rm.nodeTimeout(), func(cctx context.Context, n *rlNode) got {
		v, err := n.run(cctx, rm.keys, "s", m.kind, "", 0, "0", "").Slice()
		if err != nil {
			return got{err: err}
		}
		if len(v) != 3 {
			return got{err: fmt.Errorf("unexpected reply %v", v)}
		}
		holder, _ := v[0].(string)
		pttl, _ := v[1].(int64)
		return got{s: rlState{holder, time.Duration(max(pttl, 0)) * time.Millisecond}}
	})
	var states []rlState
	var lastErr error
	for i, g := range res {
		switch {
		case !answered[i]:
			lastErr = errNodeTimeout
		case g.err != nil:
			lastErr = g.err
		default:
			states = append(states, g.s)
		}
	}
	if len(states) < r.quorum {
		return "", 0, m.fail(op, fmt.Errorf("%w: %w", errNoQuorum, lastErr))
	}
	byHolder := map[string][]time.Duration{}
	for _, s := range states {
		if s.holder != "" {
			byHolder[s.holder] = append(byHolder[s.holder], s.left)
		}
	}
	for h, lefts := range byHolder {
		if len(lefts) >= r.quorum {
			slices.Sort(lefts)
			return h, lefts[len(lefts)-r.quorum], nil
		}
	}
	return "", 0, nil
}

func (rm *rlMutex) isLocked(ctx context.Context) (bool, error) {
	h, _, err := rm.state(ctx, "islocked")
	return h != "", err
}

func (rm *rlMutex) ttl(ctx context.Context) (time.Duration, error) {
	_, left, err := rm.state(ctx, "ttl")
	return left, err
}

// forceUnlock frees the lock on every master, whoever holds it.
func (rm *rlMutex) forceUnlock(ctx context.Context, spanName string) (released bool, err error) {
	m, r := rm.m, rm.r
	ctx, sp, err := m.begin(ctx, spanName)
	defer func() { sp.EndOther(err) }()
	if err != nil {
		return false, err
	}
	m.mu.Lock()
	if l := m.hold; l != nil {
		rm.abandon(l.Spec.ID) // a late grant must not re-take a master
	}
	m.mu.Unlock()
	ones, fails, lastErr := rm.onEvery(func(cctx context.Context, n *rlNode) (bool, error) {
		v, err := n.run(cctx, rm.keys, "f", m.kind, "", 0, "0", r.c.id).Int64()
		return v == 1, err
	})
	if ones > 0 {
		r.c.waits.Wake(rm.keys[2], wire.WakeOne, wait.WakeLocal)
		m.mu.Lock()
		l := m.hold
		m.mu.Unlock()
		if l != nil {
			r.c.wd.Lose(&l.Lease, fmt.Errorf("%w: force-unlocked", ErrLost))
		}
	}
	if ones == 0 && fails > 0 {
		return false, m.fail("forceunlock", lastErr)
	}
	return ones > 0, nil
}
