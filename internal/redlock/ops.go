package redlock

// The Redlock Mutex's calls other than acquiring: Unlock, Extend, IsLocked,
// TTL and ForceUnlock, each run on every master at once.

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/dlock-go/dlock/internal/engine"
	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/lease"
	"github.com/dlock-go/dlock/internal/scripts"
	"github.com/dlock-go/dlock/internal/wait"
	"github.com/dlock-go/dlock/internal/wire"
)

// unlock releases hold l on every master.
func (rm *Mutex) unlock(ctx context.Context, l *lease.Hold, op string) error {
	h, r := rm.h, rm.r
	h.BeginRelease(l)
	// Masters that answer the try from now on give their grant back
	// themselves; those that answered already are released below.
	rm.abandon(l.Spec.ID)
	released, failed, lastErr := rm.onEvery(func(ctx context.Context, n *master) (bool, error) {
		return rm.releaseCtx(ctx, n, l.Spec.ID)
	})
	if released > 0 {
		// This Redlock ignores its own release messages; it records the
		// release itself, for its waiters' tries at a lagging gate.
		r.firstSeen(l.Spec.ID)
		r.Core.Waits.Wake(rm.keys[2], wire.WakeOne, wait.WakeLocal)
	}
	switch {
	case released == 0 && failed > 0:
		err := h.Fail(op, lastErr)
		rm.slot.Restore(l) // let the caller retry
		return h.SettleRelease(op, l, 0, err, false)
	case released == 0:
		return h.SettleRelease(op, l, -1, nil, false)
	}
	return h.SettleRelease(op, l, 0, nil, false)
}

// extend runs Extend on every master: applied when a quorum applied it.
func (rm *Mutex) extend(ctx context.Context, spanName string, l *lease.Hold, d time.Duration) error {
	h, r := rm.h, rm.r
	return h.ExtendBy(ctx, spanName, l, d, func(context.Context) (lease.ExtendOutcome, error) {
		type got struct {
			ok  bool
			err error
		}
		res, answered := fanOut(r, context.Background(), rm.nodeTimeout(), func(ctx context.Context, n *master) got {
			v, err := scripts.Renew.Run(ctx, n.rdb, []string{l.Key}, wire.Millis(d), l.Arg).Int64Slice()
			return got{err == nil && len(v) == 1 && v[0] == 1, err}
		})
		var applied []*master
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
		return lease.ExtendUnknown, h.Fail("extend", fmt.Errorf("%w: %w", errNoQuorum, lastErr))
	})
}

// masterState is one master's view of the lock.
type masterState struct {
	holder string
	left   time.Duration
	token  uint64 // the holder's fencing token there
}

// state reads the lock on every master and returns the holder a quorum
// agrees on ("" when none), what its lease has left on the quorum (the
// quorum-th longest) and its token (the highest those masters have).
func (rm *Mutex) state(ctx context.Context, op string) (string, time.Duration, uint64, error) {
	h, r := rm.h, rm.r
	if err := h.Usable(ctx); err != nil {
		return "", 0, 0, err
	}
	type got struct {
		s   masterState
		err error
	}
	res, answered := fanOut(r, engine.Detach(ctx), rm.nodeTimeout(), func(cctx context.Context, n *master) got {
		v, err := n.run(cctx, rm.keys, "s", h.Kind, "", 0, "0", "").Slice()
		if err != nil {
			return got{err: err}
		}
		if len(v) != 3 {
			return got{err: fmt.Errorf("unexpected reply %v", v)}
		}
		holder, _ := v[0].(string)
		pttl, _ := v[1].(int64)
		fence, _ := v[2].(string)
		token, _ := strconv.ParseUint(fence, 10, 64)
		return got{s: masterState{holder, time.Duration(max(pttl, 0)) * time.Millisecond, token}}
	})
	var states []masterState
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
		return "", 0, 0, h.Fail(op, fmt.Errorf("%w: %w", errNoQuorum, lastErr))
	}
	byHolder := map[string][]masterState{}
	for _, s := range states {
		if s.holder != "" {
			byHolder[s.holder] = append(byHolder[s.holder], s)
		}
	}
	for holder, on := range byHolder {
		if len(on) >= r.quorum {
			lefts := make([]time.Duration, 0, len(on))
			var token uint64
			for _, s := range on {
				lefts = append(lefts, s.left)
				token = max(token, s.token)
			}
			slices.Sort(lefts)
			return holder, lefts[len(lefts)-r.quorum], token, nil
		}
	}
	return "", 0, 0, nil
}

// forceUnlock frees the lock on every master, whoever holds it.
func (rm *Mutex) forceUnlock(ctx context.Context, spanName string) (released bool, err error) {
	h, r := rm.h, rm.r
	ctx, sp, err := h.Begin(ctx, spanName)
	defer func() { sp.EndOther(err) }()
	if err != nil {
		return false, err
	}
	if l := rm.slot.Get(); l != nil {
		rm.abandon(l.Spec.ID) // a late grant must not re-take a master
	}
	ones, fails, lastErr := rm.onEvery(func(cctx context.Context, n *master) (bool, error) {
		v, err := n.run(cctx, rm.keys, "f", h.Kind, "", 0, "0", r.Core.ID).Int64()
		return v == 1, err
	})
	if ones > 0 {
		r.Core.Waits.Wake(rm.keys[2], wire.WakeOne, wait.WakeLocal)
		if l := rm.slot.Get(); l != nil {
			r.Core.WD.Lose(&l.Lease, fmt.Errorf("%w: force-unlocked", errs.ErrLost))
		}
	}
	if ones == 0 && fails > 0 {
		return false, h.Fail("forceunlock", lastErr)
	}
	return ones > 0, nil
}
