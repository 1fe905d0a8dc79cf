package engine

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/dlock-go/dlock/internal/scripts"
	"github.com/dlock-go/dlock/internal/wire"
)

// Excl is an exclusive lock as the excl_*.lua scripts keep it: the model
// that Mutex, ReentrantMutex and Election share (see
// internal/scripts/excl_common.lua). It runs the scripts and wakes the
// waiters of this Core that a script handed the lock to.
type Excl struct {
	h       *Handle
	keys    []string // K, Q, QE, F, RL and the channel (see internal/scripts/excl_common.lua)
	counted string   // "1" for a counted kind (ReentrantMutex), else "0"
}

// ExclKeys are the auxiliary keys of an exclusive lock: its queue, the
// token memory every lock kind shares, and an RWMutex's readers, which a
// try looks at before it takes over a released RWMutex's name (see
// internal/scripts/excl_common.lua).
var ExclKeys = []string{":mq", ":mqe", ":f", ":rl"}

// NewExcl returns the exclusive lock of h, whose keys are ExclKeys; a
// counted lock (a ReentrantMutex) counts re-entries.
func NewExcl(h *Handle, counted bool) *Excl {
	x := &Excl{h: h, keys: h.Keys, counted: "0"}
	if counted {
		x.counted = "1"
	}
	return x
}

// Try runs excl_try for the waiter id, queued as waiter (with reserve
// tokens reserved after its own: see wire.ExclWaiter): take, claim or
// re-enter the lock, or, with markTTL > 0, queue. known is, for a counted
// lock, the holds this Core has recorded for the owner id: a hold of id
// that it has not recorded is a hand-over, which the try claims.
func (x *Excl) Try(ctx context.Context, waiter, id string, reserve int, ttl, markTTL time.Duration, known int64) (wire.Try, error) {
	c := x.h.C
	res, err := c.Script(ctx, scripts.ExclTry, x.keys, x.h.Kind, waiter, wire.Millis(ttl), wire.Millis(markTTL), c.ID, x.counted, id, reserve, known).Result()
	if err != nil {
		return wire.Try{}, err
	}
	r, err := wire.DecodeTry(res)
	if err == nil && !r.Held && wire.ClientOf(r.Holder) == c.ID {
		// The holder may be a waiter of this Client that the script just
		// handed the lock to, or one whose hand-over message is on its way:
		// either way it holds the lock and is told so here.
		x.handedTo(r.Holder, r.Token, r.Left)
	}
	return r, err
}

// Unlock runs excl_unlock for the holder id: it returns the holds id has
// left (0: released; -1: it held none).
func (x *Excl) Unlock(ctx context.Context, id string) (int64, error) {
	return x.unlockCohort(ctx, id, nil, nil)
}

// unlockCohort is Unlock for the end of a cohort (cohort.go): it drops the
// queue places of drop first, and queues those of enqueue, in order, before
// the lock passes on.
func (x *Excl) unlockCohort(ctx context.Context, id string, drop, enqueue []string) (int64, error) {
	c := x.h.C
	args := []any{x.h.Kind, id, c.ID, x.counted}
	if len(drop)+len(enqueue) > 0 {
		args = append(args, wire.Millis(x.h.MarkLease()), len(drop))
		for _, d := range drop {
			args = append(args, d)
		}
		for _, d := range enqueue {
			args = append(args, d)
		}
	}
	res, err := c.Script(ctx, scripts.ExclUnlock, x.keys, args...).Result()
	if err != nil {
		x.h.WakeUnknown(err)
		return 0, err
	}
	switch res := res.(type) {
	case int64: // the hot path's reply: freed
		return res, nil
	case []any:
		return x.h.SettleHandover(res)
	}
	return 0, fmt.Errorf("unexpected reply %v", res)
}

// Cancel runs excl_cancel for a waiter that stops waiting: it passes on a
// hand-over the waiter held, if any.
func (x *Excl) Cancel(ctx context.Context, waiter string) { x.CancelOwner(ctx, waiter, 0) }

// CancelOwner is Cancel for a counted lock's owner, of whose holds this Core
// has recorded known: with none recorded, a hold of the owner is a
// hand-over nobody took, which passes on.
func (x *Excl) CancelOwner(ctx context.Context, waiter string, known int64) {
	c := x.h.C
	res, err := c.Script(ctx, scripts.ExclCancel, x.keys, x.h.Kind, waiter, c.ID, x.counted, known).Slice()
	if err != nil {
		x.h.WakeUnknown(err)
		return
	}
	_, _ = x.h.SettleHandover(res)
}

// handedTo wakes the waiters of this Core that a script handed the lock
// to under id, with its fencing token and lease.
func (x *Excl) handedTo(id string, token uint64, ttl time.Duration) {
	if id != "" {
		x.h.handedTo([]string{id}, token, ttl)
	}
}

// ExclState is what an exclusive lock looks like at one moment.
type ExclState struct {
	Holder  string        // the holder's ID; "" when free
	Left    time.Duration // what the holder's lease has left
	Count   int64         // the holder's hold count
	Token   uint64        // the fencing token of the current or last hold; 0 when none is known
	Waiting int64         // live waiters queued
}

// State reads the lock with excl_state, checking that its keys are this
// kind's.
func (x *Excl) State(ctx context.Context) (ExclState, error) {
	res, err := x.h.C.Script(ctx, scripts.ExclState, x.keys[:3], x.h.Kind).Slice()
	if err != nil {
		return ExclState{}, err
	}
	if len(res) != 5 {
		return ExclState{}, fmt.Errorf("unexpected reply %v", res)
	}
	var st ExclState
	st.Holder, _ = res[0].(string)
	left, _ := res[1].(int64)
	st.Left = time.Duration(left) * time.Millisecond
	st.Count, _ = res[2].(int64)
	token, _ := res[3].(string)
	st.Token, _ = strconv.ParseUint(token, 10, 64)
	st.Waiting, _ = res[4].(int64)
	return st, nil
}

// ForceUnlock runs a ForceUnlock call: it releases the lock whoever holds
// it, handing it to the first live waiter if any, and reports whether it was
// held. lose reports the holds of this Client on it lost; holders elsewhere
// learn at their next renewal.
func (x *Excl) ForceUnlock(ctx context.Context, spanName string, lose func(cause error)) (bool, error) {
	return x.h.ForceUnlock(ctx, spanName, func(ctx context.Context) ([]any, error) {
		return x.h.C.Script(ctx, scripts.ExclForce, x.keys, x.h.Kind, x.h.C.ID, x.counted).Slice()
	}, lose)
}

// IsLocked reports whether anyone holds the lock.
func (x *Excl) IsLocked(ctx context.Context, op string) (bool, error) {
	if err := x.h.Usable(ctx); err != nil {
		return false, err
	}
	st, err := x.State(ctx)
	if err != nil {
		return false, x.h.Fail(op, err)
	}
	return st.Holder != "", nil
}

// TTL returns what the holder's lease has left, 0 when free.
func (x *Excl) TTL(ctx context.Context, op string) (time.Duration, error) {
	if err := x.h.Usable(ctx); err != nil {
		return 0, err
	}
	st, err := x.State(ctx)
	if err != nil {
		return 0, x.h.Fail(op, err)
	}
	return st.Left, nil
}

// Keys are the lock's keys: K, Q, QE, F, RL and the channel (see
// internal/scripts/excl_common.lua).
func (x *Excl) Keys() []string { return x.keys }
