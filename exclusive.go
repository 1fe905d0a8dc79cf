package dlock

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/dlock-go/dlock/internal/wire"

	"github.com/dlock-go/dlock/internal/scripts"
)

// excl is an exclusive lock as the excl_*.lua scripts keep it: the model
// that Mutex, ReentrantMutex and Election share (see
// internal/scripts/excl_common.lua). It runs the scripts and wakes the waiters of
// this Client that a script handed the lock to.
type excl struct {
	h       *handle
	keys    []string // K, Q, QE, F, RL and the channel (see internal/scripts/excl_common.lua)
	counted string   // "1" for a counted kind (ReentrantMutex), else "0"
}

// exclKeys are the auxiliary keys of an exclusive lock: its queue, the
// token memory every lock kind shares, and an RWMutex's readers, which a
// try looks at before it takes over a released RWMutex's name (see
// internal/scripts/excl_common.lua).
var exclKeys = []string{":mq", ":mqe", ":f", ":rl"}

func newExcl(h *handle, counted bool) excl {
	x := excl{h: h, keys: h.keys, counted: "0"}
	if counted {
		x.counted = "1"
	}
	return x
}

// try runs excl_try for the waiter id, queued as waiter (with reserve
// tokens reserved after its own: see wire.ExclWaiter): take, claim or
// re-enter the lock, or, with markTTL > 0, queue.
func (x *excl) try(ctx context.Context, waiter, id string, reserve int, ttl, markTTL time.Duration) (wire.Try, error) {
	c := x.h.c
	res, err := c.script(ctx, scripts.ExclTry, x.keys, x.h.kind, waiter, millis(ttl), millis(markTTL), c.id, x.counted, id, reserve).Result()
	if err != nil {
		return wire.Try{}, err
	}
	r, err := wire.DecodeTry(res)
	if err == nil && !r.Held && wire.ClientOf(r.Holder) == c.id {
		// The holder may be a waiter of this Client that the script just
		// handed the lock to, or one whose hand-over message is on its way:
		// either way it holds the lock and is told so here.
		x.handedTo(r.Holder, r.Token, r.Left)
	}
	return r, err
}

// unlock runs excl_unlock for the holder id: it returns the holds id has
// left (0: released; -1: it held none).
func (x *excl) unlock(ctx context.Context, id string) (int64, error) {
	return x.unlockCohort(ctx, id, nil, nil)
}

// unlockCohort is unlock for the end of a cohort (cohort.go): it drops the
// queue places of drop first, and queues those of enqueue, in order, before
// the lock passes on.
func (x *excl) unlockCohort(ctx context.Context, id string, drop, enqueue []string) (int64, error) {
	c := x.h.c
	args := []any{x.h.kind, id, c.id, x.counted}
	if len(drop)+len(enqueue) > 0 {
		args = append(args, millis(x.h.markLease()), len(drop))
		for _, d := range drop {
			args = append(args, d)
		}
		for _, d := range enqueue {
			args = append(args, d)
		}
	}
	res, err := c.script(ctx, scripts.ExclUnlock, x.keys, args...).Result()
	if err != nil {
		x.h.wakeUnknown(err)
		return 0, err
	}
	switch res := res.(type) {
	case int64: // the hot path's reply: freed
		return res, nil
	case []any:
		return x.h.settleHandover(res)
	}
	return 0, fmt.Errorf("unexpected reply %v", res)
}

// cancel runs excl_cancel for a waiter that stops waiting, and reports
// whether it held a hand-over that it has now passed on.
func (x *excl) cancel(ctx context.Context, waiter string) {
	c := x.h.c
	res, err := c.script(ctx, scripts.ExclCancel, x.keys, x.h.kind, waiter, c.id, x.counted).Slice()
	if err != nil {
		x.h.wakeUnknown(err)
		return
	}
	_, _ = x.h.settleHandover(res)
}

// settleHandover reads a releasing script's reply, {n, ""} or {n, ids,
// token, ttl ms}, and wakes the waiters of this Client it handed the lock
// to, if any. It returns n.
func (h *handle) settleHandover(res []any) (int64, error) {
	n, next, err := pair(res[:min(len(res), 2)])
	if err != nil || next == "" || len(res) < 4 {
		return n, err
	}
	s, _ := res[2].(string)
	token, _ := strconv.ParseUint(s, 10, 64)
	ms, _ := res[3].(int64)
	h.handedTo(strings.Split(next, ","), token, time.Duration(ms)*time.Millisecond)
	return n, nil
}

// handedTo wakes the waiters of this Client that a script handed the lock
// to under id, with its fencing token and lease.
func (x *excl) handedTo(id string, token uint64, ttl time.Duration) {
	if id != "" {
		x.h.handedTo([]string{id}, token, ttl)
	}
}

// exclState is what an exclusive lock looks like at one moment.
type exclState struct {
	holder  string        // the holder's ID; "" when free
	left    time.Duration // what the holder's lease has left
	count   int64         // the holder's hold count
	token   uint64        // the fencing token of the current or last hold; 0 when none is known
	waiting int64         // live waiters queued
}

// state reads the lock with excl_state, checking that its keys are this
// kind's.
func (x *excl) state(ctx context.Context) (exclState, error) {
	res, err := x.h.c.script(ctx, scripts.ExclState, x.keys[:3], x.h.kind).Slice()
	if err != nil {
		return exclState{}, err
	}
	if len(res) != 5 {
		return exclState{}, fmt.Errorf("unexpected reply %v", res)
	}
	var st exclState
	st.holder, _ = res[0].(string)
	left, _ := res[1].(int64)
	st.left = time.Duration(left) * time.Millisecond
	st.count, _ = res[2].(int64)
	token, _ := res[3].(string)
	st.token, _ = strconv.ParseUint(token, 10, 64)
	st.waiting, _ = res[4].(int64)
	return st, nil
}

// forceUnlock runs a ForceUnlock call: it releases the lock whoever holds
// it, handing it to the first live waiter if any, and reports whether it was
// held. lose reports the holds of this Client on it lost; holders elsewhere
// learn at their next renewal.
func (x *excl) forceUnlock(ctx context.Context, spanName string, lose func(cause error)) (bool, error) {
	return x.h.forceUnlock(ctx, spanName, func(ctx context.Context) ([]any, error) {
		return x.h.c.script(ctx, scripts.ExclForce, x.keys, x.h.kind, x.h.c.id, x.counted).Slice()
	}, lose)
}

// forceUnlock runs a ForceUnlock call whose script, run, answers as a
// releasing script does ({1 when it was held, else 0, and whom it handed the
// lock to}), and wakes this Client's waiters it handed the lock to.
func (h *handle) forceUnlock(ctx context.Context, spanName string, run func(context.Context) ([]any, error), lose func(cause error)) (released bool, err error) {
	ctx, sp, err := h.begin(ctx, spanName)
	defer func() { sp.EndOther(err) }()
	if err != nil {
		return false, err
	}
	res, err := run(detach(ctx))
	if err != nil {
		h.wakeUnknown(err)
		return false, h.fail("forceunlock", err)
	}
	n, err := h.settleHandover(res)
	if n == 1 {
		lose(fmt.Errorf("%w: force-unlocked", ErrLost))
	}
	return n == 1, err
}

// isLocked reports whether anyone holds the lock.
func (x *excl) isLocked(ctx context.Context, op string) (bool, error) {
	if err := x.h.usable(ctx); err != nil {
		return false, err
	}
	st, err := x.state(ctx)
	if err != nil {
		return false, x.h.fail(op, err)
	}
	return st.holder != "", nil
}

// ttl returns what the holder's lease has left, 0 when free.
func (x *excl) ttl(ctx context.Context, op string) (time.Duration, error) {
	if err := x.h.usable(ctx); err != nil {
		return 0, err
	}
	st, err := x.state(ctx)
	if err != nil {
		return 0, x.h.fail(op, err)
	}
	return st.left, nil
}
