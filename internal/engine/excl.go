package engine

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/scripts"
	"github.com/dlock-go/dlock/internal/wire"
)

// Excl is an exclusive lock as the excl_*.lua scripts keep it: the model
// that Mutex, ReentrantMutex and Election share (see
// internal/scripts/excl_common.lua). It runs the scripts and wakes the
// waiters of this Core that a script handed the lock to.
type Excl struct {
	h       *Handle
	keys    []string // K, Q, QE, F, RL and the channel (see internal/scripts/excl_common.lua); an RWMutex's for NewRWWriteExcl
	counted string   // "1" for a counted kind (ReentrantMutex), else "0"
	s       *exclScripts
	owner   string // an RWMutex writer's owner, for the write try's upgrade check (rw_try_write.lua)
	boxed   exclBoxed
}

// exclBoxed are an Excl's arguments that every try and unlock sends, boxed
// once rather than for every call: boxing a string allocates, and the hot
// path's allocations cost its client a measurable share of its time.
type exclBoxed struct {
	keys                  []any // Excl.keys
	kind, client, counted any
}

// exclScripts are the scripts an Excl runs, with the same arguments and
// replies (see internal/scripts/excl_*.lua): the exclusive locks', or an
// RWMutex's write side (rw_*.lua, which take and return the same).
type exclScripts struct {
	try, unlock, cancel, state, force *redis.Script
	stateKeys                         int // the keys the state script takes (the first ones)
	queue, mark                       int // where in keys the queue (Q) and the waiting marks (QE) are
	waiter                            func(lease time.Duration, reserve int, id string) string
}

var (
	exclLock = &exclScripts{try: scripts.ExclTry, unlock: scripts.ExclUnlock, cancel: scripts.ExclCancel,
		state: scripts.ExclState, force: scripts.ExclForce, stateKeys: 3, queue: 1, mark: 2, waiter: wire.ExclWaiter}
	// (No force script: an RWMutex's ForceUnlock, of writer and readers
	// alike, runs rw_force itself.)
	exclRWWrite = &exclScripts{try: scripts.RWTryWrite, unlock: scripts.RWUnlockWrite, cancel: scripts.RWCancel,
		state: scripts.RWState, stateKeys: 5, queue: 3, mark: 4, waiter: wire.RWWriter}
)

// ExclKeys are the auxiliary keys of an exclusive lock: its queue, the
// token memory every lock kind shares, and an RWMutex's readers, which a
// try looks at before it takes over a released RWMutex's name (see
// internal/scripts/excl_common.lua).
var ExclKeys = []string{":mq", ":mqe", ":f", ":rl"}

// RWKeys are the auxiliary keys of an RWMutex: its readers' leases and
// counts, its queue, and the token memory (see
// internal/scripts/rw_common.lua).
var RWKeys = []string{":rl", ":rc", ":mq", ":mqe", ":f"}

// NewExcl returns the exclusive lock of h, whose keys are ExclKeys; a
// counted lock (a ReentrantMutex) counts re-entries.
func NewExcl(h *Handle, counted bool) *Excl { return newExcl(h, counted, exclLock) }

// NewRWWriteExcl returns the write side of the RWMutex whose handle is h
// (keys W, RL, RC, Q, QE, F: see internal/scripts/rw_common.lua) as an
// exclusive lock: its writers hold it under grant IDs, as a ReentrantMutex
// does (see Reentrant).
func NewRWWriteExcl(h *Handle, counted bool) *Excl { return newExcl(h, counted, exclRWWrite) }

func newExcl(h *Handle, counted bool, s *exclScripts) *Excl {
	x := &Excl{h: h, keys: h.Keys, counted: "0", s: s}
	if counted {
		x.counted = "1"
	}
	x.boxed = exclBoxed{keys: make([]any, len(x.keys)), kind: h.Kind, client: h.C.ID, counted: x.counted}
	for i, k := range x.keys {
		x.boxed.keys[i] = k
	}
	return x
}

// forOwner returns x for a writer of owner (the RWMutex's upgrade check).
func (x *Excl) forOwner(owner string) *Excl {
	if x.s != exclRWWrite || owner == "" {
		return x
	}
	c := *x
	c.owner = owner
	return &c
}

// waiter names a waiter of the lock (see internal/wire's waiter.go).
func (x *Excl) waiter(lease time.Duration, reserve int, id string) string {
	return x.s.waiter(lease, reserve, id)
}

// markKeys are where a waiter's place is kept: the marks (QE), and the
// queue (Q), which the marks' renewals keep alive too.
func (x *Excl) markKeys() (string, []string) {
	return x.keys[x.s.mark], x.keys[x.s.queue : x.s.queue+1]
}

// Try runs excl_try for the waiter id, queued as waiter (with reserve
// tokens reserved after its own: see wire.ExclWaiter): take, claim or
// re-enter the lock, or, with markTTL > 0, queue. known is, for a counted
// lock, the holds this Core has recorded for the owner id: a hold of id
// that it has not recorded is a hand-over, which the try claims.
func (x *Excl) Try(ctx context.Context, waiter, id string, reserve int, ttl, markTTL time.Duration, known int64) (wire.Try, error) {
	c := x.h.C
	b := &x.boxed
	args := []any{b.kind, waiter, wire.Millis(ttl), wire.Millis(markTTL), b.client, b.counted, id, reserve, known}
	if x.owner != "" {
		args = append(args, x.owner)
	}
	res, err := c.ScriptBoxed(ctx, x.s.try, x.keys, b.keys, args...).Result()
	if err != nil {
		return wire.Try{}, err
	}
	r, err := wire.DecodeTry(res)
	if err == nil && !r.Held && r.Token > 0 && wire.ClientOf(r.Holder) == c.ID {
		// The holder may be a waiter of this Client that the script just
		// handed the lock to, or one whose hand-over message is on its way:
		// either way it holds the lock and is told so here. (Not a reader
		// of an RWMutex, named without a token when only readers block a
		// writer's try.)
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
	c, b := x.h.C, &x.boxed
	args := []any{b.kind, id, b.client, b.counted}
	if len(drop)+len(enqueue) > 0 {
		args = append(args, wire.Millis(x.h.MarkLease()), len(drop))
		for _, d := range drop {
			args = append(args, d)
		}
		for _, d := range enqueue {
			args = append(args, d)
		}
	}
	res, err := c.ScriptBoxed(ctx, x.s.unlock, x.keys, b.keys, args...).Result()
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
	res, err := c.Script(ctx, x.s.cancel, x.keys, x.h.Kind, waiter, c.ID, x.counted, known).Slice()
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
	res, err := x.h.C.Script(ctx, x.s.state, x.keys[:x.s.stateKeys], x.h.Kind).Slice()
	if err != nil {
		return ExclState{}, err
	}
	if x.s == exclRWWrite && len(res) == 6 {
		res = append(res[:4], res[5]) // (rw_state.lua: the readers' count before the waiters')
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
	if x.s.force == nil {
		return false, errs.Op("forceunlock", x.h.Name, "not an exclusive lock's", errs.ErrInvalid)
	}
	return x.h.ForceUnlock(ctx, spanName, func(ctx context.Context) ([]any, error) {
		return x.h.C.Script(ctx, x.s.force, x.keys, x.h.Kind, x.h.C.ID, x.counted).Slice()
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
