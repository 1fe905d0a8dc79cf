package torture

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/torture/history"
)

// run does one random task on t's primitive and name.
func (t *task) run() {
	w := t.w
	switch t.prim {
	case history.Mutex:
		t.mutex(w.main.Mutex(t.name))
	case history.MutexNoCohort:
		t.mutex(w.main.Mutex(t.name, dlock.WithoutCohort()))
	case history.Redlock:
		t.mutex(w.redlock.Mutex(t.name))
	case history.Sentinel:
		t.mutex(w.sentinel.Mutex(t.name))
	case history.MultiLock:
		t.multiLock()
	case history.HandOver:
		t.handOver()
	case history.Reentrant:
		t.reentrant()
	case history.RW:
		t.rw()
	case history.Semaphore:
		t.semaphore()
	case history.Latch:
		t.latch()
	case history.Election:
		t.election()
	}
}

// mutex: Lock (or TryLock), work under the hold, Unlock.
func (t *task) mutex(m *dlock.Mutex) {
	f := history.Lock
	if t.rng.IntN(5) == 0 {
		f = history.TryLock
	}
	id := t.invoke(f, history.Event{})
	ctx, cancel := t.acquireCtx()
	var err error
	if f == history.TryLock {
		var ok bool
		ok, err = m.TryLock(ctx)
		if err == nil && !ok {
			err = dlock.ErrNotObtained
		}
	} else {
		err = m.Lock(ctx)
	}
	cancel()
	if err != nil {
		t.complete(id, f, err, history.Event{})
		return
	}
	token := m.Token()
	h := t.watch(m.Lost(), t.holder, false)
	t.complete(id, f, nil, history.Event{Tok: token})
	t.work(h, t.name, token)
	t.release(h, func(ctx context.Context) error { return m.Unlock(ctx) })
}

// release runs the Unlock of a hold, recorded, and stops watching it.
func (t *task) release(h *hold, unlock func(context.Context) error) {
	id := t.invoke(history.Unlock, history.Event{})
	ctx, cancel := opCtx()
	err := unlock(ctx)
	cancel()
	t.complete(id, history.Unlock, err, history.Event{})
	if outcome(err) != history.Info {
		h.end()
		return
	}
	// The release may not have happened: the hold ends by its lease, and
	// Lost fires then. Watch for it that long.
	t.w.bg.Go(func() {
		timer := time.NewTimer(2 * t.w.spec.Lease)
		defer timer.Stop()
		select {
		case <-timer.C:
		case <-t.w.stop.Done():
		}
		h.end()
	})
}

// multiLock: two or three mutex names held together.
func (t *task) multiLock() {
	names := []string{}
	for _, i := range t.rng.Perm(t.w.spec.Names)[:min(t.w.spec.Names, 2+t.rng.IntN(2))] {
		names = append(names, fmt.Sprintf("%s%d", history.Mutex, i))
	}
	ml := t.w.main.MultiLock(names)
	names = ml.Names()
	id := t.invoke(history.Lock, history.Event{Names: names})
	ctx, cancel := t.acquireCtx()
	err := ml.Lock(ctx)
	cancel()
	if err != nil {
		t.complete(id, history.Lock, err, history.Event{Names: names})
		return
	}
	toks := ml.Tokens()
	h := t.watch(ml.Lost(), t.holder, false)
	t.complete(id, history.Lock, nil, history.Event{Names: names, Toks: toks})
	d := t.holdFor()
	for _, n := range names {
		if h.isLost() {
			break
		}
		t.write(n, toks[n])
	}
	time.Sleep(d)
	id = t.invoke(history.Unlock, history.Event{Names: names})
	octx, ocancel := opCtx()
	err = ml.Unlock(octx)
	ocancel()
	t.complete(id, history.Unlock, err, history.Event{Names: names})
	h.end()
}

// handOver: a hold taken on the main Client is handed over, as a HoldRef,
// to the worker's second Client, which extends it and releases it.
func (t *task) handOver() {
	m := t.w.main.Mutex(t.name)
	id := t.invoke(history.Lock, history.Event{})
	ctx, cancel := t.acquireCtx()
	err := m.Lock(ctx)
	cancel()
	if err != nil {
		t.complete(id, history.Lock, err, history.Event{})
		return
	}
	token := m.Token()
	h := t.watch(m.Lost(), t.holder, false)
	t.complete(id, history.Lock, nil, history.Event{Tok: token})
	if h.isLost() {
		t.release(h, func(ctx context.Context) error { return m.Unlock(ctx) })
		return
	}
	ref, err := m.HandOver()
	h.end() // m no longer watches the hold; the bearer keeps its own deadline
	if err != nil {
		t.point(history.Lost, history.Event{})
		return
	}
	bearer := t.holder + "h"
	t.point(history.Handed, history.Event{NewHolder: bearer})
	lease := t.w.spec.Lease
	sent := time.Now()
	ectx, ecancel := opCtx()
	err = t.w.second.ExtendRef(ectx, ref, lease)
	ecancel()
	if err != nil {
		// The hold may be gone, or may end any time: stop using it.
		t.point(history.Lost, history.Event{Holder: bearer})
		return
	}
	t.point(history.Claimed, history.Event{Holder: bearer})
	// The bearer's deadline, as dlock's own: the extension's send time plus
	// the lease, less the drift margin.
	deadline := sent.Add(lease - lease/100 - 2*time.Millisecond)
	lost := make(chan struct{})
	timer := time.AfterFunc(time.Until(deadline), func() {
		t.point(history.Lost, history.Event{Holder: bearer})
		close(lost)
	})
	bt := *t
	bt.holder = bearer
	bh := &hold{lost: lost, t: &bt}
	bt.work(bh, t.name, ref.Token)
	if !timer.Stop() {
		return // lost: the bearer stops using it; its lease ends it
	}
	rid := bt.invoke(history.Unlock, history.Event{})
	rctx, rcancel := opCtx()
	err = t.w.second.ReleaseRef(rctx, ref)
	rcancel()
	bt.complete(rid, history.Unlock, err, history.Event{})
}

// reentrant: one owner locks one to three levels deep, then unlocks them.
func (t *task) reentrant() {
	r := t.w.main.ReentrantMutex(t.name)
	ctx := dlock.WithOwner(context.Background(), t.holder)
	depth := 1 + t.rng.IntN(3)
	var h *hold
	var token uint64
	held := 0
	for level := 1; level <= depth; level++ {
		f := history.Lock
		if t.rng.IntN(6) == 0 {
			f = history.TryLock
		}
		id := t.invoke(f, history.Event{})
		actx, cancel := t.acquireCtx()
		actx = dlock.WithOwner(actx, t.holder)
		var err error
		if f == history.TryLock {
			var ok bool
			ok, err = r.TryLock(actx)
			if err == nil && !ok {
				err = dlock.ErrNotObtained
			}
		} else {
			err = r.Lock(actx)
		}
		cancel()
		if err != nil {
			t.complete(id, f, err, history.Event{})
			break
		}
		held++
		if h == nil {
			token = r.Token(ctx)
			h = t.watch(r.Lost(ctx), t.holder, false)
		}
		t.complete(id, f, nil, history.Event{Tok: r.Token(ctx), N: int64(held)})
		if h.isLost() {
			break
		}
		t.write(t.name, token)
	}
	if held == 0 {
		return
	}
	t.work(h, t.name, token)
	for ; held > 0; held-- {
		id := t.invoke(history.Unlock, history.Event{})
		octx, cancel := opCtx()
		err := r.Unlock(dlock.WithOwner(octx, t.holder))
		cancel()
		t.complete(id, history.Unlock, err, history.Event{N: int64(held - 1)})
		if err != nil {
			break // lost, or unknown: the hold ends by its lease
		}
	}
	h.end()
}

// rw: one owner reads or writes, sometimes re-entering, sometimes a writer
// that also reads (downgrade).
func (t *task) rw() {
	rw := t.w.main.RWMutex(t.name)
	ctx := dlock.WithOwner(context.Background(), t.holder)
	acquire := func(f string, lock func(context.Context) error) bool {
		id := t.invoke(f, history.Event{})
		actx, cancel := t.acquireCtx()
		err := lock(dlock.WithOwner(actx, t.holder))
		cancel()
		e := history.Event{}
		if err == nil && (f == history.Lock || f == history.TryLock) {
			e.Tok = rw.Token(ctx)
		}
		t.complete(id, f, err, e)
		return err == nil
	}
	releaseOne := func(f string, unlock func(context.Context) error) error {
		id := t.invoke(f, history.Event{})
		octx, cancel := opCtx()
		err := unlock(dlock.WithOwner(octx, t.holder))
		cancel()
		t.complete(id, f, err, history.Event{})
		return err
	}
	if t.rng.IntN(2) == 0 { // a reader
		f, lock := history.RLock, rw.RLock
		if t.rng.IntN(5) == 0 {
			f, lock = history.TryRLock, func(ctx context.Context) error { return tryErr(rw.TryRLock(ctx)) }
		}
		if !acquire(f, lock) {
			return
		}
		h := t.watch(rw.RLost(ctx), t.holder, true)
		n := 1
		if t.rng.IntN(4) == 0 && acquire(history.RLock, rw.RLock) {
			n++
		}
		t.work(h, "", 0)
		for ; n > 0; n-- {
			if releaseOne(history.RUnlock, rw.RUnlock) != nil {
				break
			}
		}
		h.end()
		return
	}
	f, lock := history.Lock, rw.Lock
	if t.rng.IntN(5) == 0 {
		f, lock = history.TryLock, func(ctx context.Context) error { return tryErr(rw.TryLock(ctx)) }
	}
	if !acquire(f, lock) {
		return
	}
	token := rw.Token(ctx)
	h := t.watch(rw.Lost(ctx), t.holder, false)
	t.work(h, t.name, token)
	if t.rng.IntN(4) == 0 && !h.isLost() && acquire(history.RLock, rw.RLock) { // downgrade
		rh := t.watch(rw.RLost(ctx), t.holder, true)
		err := releaseOne(history.Unlock, rw.Unlock)
		h.end()
		if err == nil {
			t.work(rh, "", 0)
		}
		_ = releaseOne(history.RUnlock, rw.RUnlock)
		rh.end()
		return
	}
	_ = releaseOne(history.Unlock, rw.Unlock)
	h.end()
}

func tryErr(ok bool, err error) error {
	if err == nil && !ok {
		return dlock.ErrNotObtained
	}
	return err
}

// semaphore: one or two permits, held a while; or every free one.
func (t *task) semaphore() {
	s := t.w.main.Semaphore(t.name)
	n := 1 + t.rng.IntN(2)
	f := history.Acquire
	switch r := t.rng.IntN(10); {
	case r < 2:
		f = history.TryAcquire
	case r < 3:
		f = "drain"
	}
	id := t.invoke(history.Acquire, history.Event{N: int64(n)})
	ctx, cancel := t.acquireCtx()
	var p *dlock.Permit
	var err error
	switch f {
	case history.Acquire:
		p, err = s.Acquire(ctx, n)
	case history.TryAcquire:
		p, err = s.TryAcquire(ctx, n)
	default:
		p, err = s.Drain(ctx)
		if err == nil && p.Count() == 0 {
			err = dlock.ErrNotObtained
		}
	}
	cancel()
	if err != nil {
		t.complete(id, history.Acquire, err, history.Event{N: int64(n)})
		return
	}
	h := t.watch(p.Lost(), t.holder, false)
	t.complete(id, history.Acquire, nil, history.Event{N: int64(p.Count()), Tok: p.Token()})
	t.work(h, "", 0)
	rid := t.invoke(history.Release, history.Event{N: int64(p.Count())})
	octx, ocancel := opCtx()
	err = p.Release(octx)
	ocancel()
	t.complete(rid, history.Release, err, history.Event{N: int64(p.Count())})
	h.end()
}

// latch: set, count down, await or delete.
func (t *task) latch() {
	l := t.w.main.CountDownLatch(t.name)
	switch r := t.rng.IntN(20); {
	case r < 4:
		n := int64(1 + t.rng.IntN(3))
		id := t.invoke(history.SetCount, history.Event{N: n})
		ctx, cancel := opCtx()
		ok, err := l.TrySetCount(ctx, n)
		cancel()
		t.complete(id, history.SetCount, err, history.Event{N: n, B: ok})
	case r < 12:
		id := t.invoke(history.CountDown, history.Event{})
		ctx, cancel := opCtx()
		err := l.CountDown(ctx)
		cancel()
		t.complete(id, history.CountDown, err, history.Event{})
	case r < 19:
		id := t.invoke(history.Await, history.Event{})
		ctx, cancel := t.acquireCtx()
		err := l.Await(ctx)
		cancel()
		t.complete(id, history.Await, err, history.Event{})
	default:
		id := t.invoke(history.Delete, history.Event{})
		ctx, cancel := opCtx()
		_, err := l.Delete(ctx)
		cancel()
		t.complete(id, history.Delete, err, history.Event{})
	}
}

// election: campaign, lead a while with fenced writes, resign.
func (t *task) election() {
	e := t.w.main.Election(t.name)
	id := t.invoke(history.Lock, history.Event{})
	ctx, cancel := t.acquireCtx()
	err := e.Campaign(ctx, t.holder)
	cancel()
	if err != nil {
		t.complete(id, history.Lock, err, history.Event{})
		return
	}
	token := e.Token()
	h := t.watch(e.Lost(), t.holder, false)
	t.complete(id, history.Lock, nil, history.Event{Tok: token})
	t.work(h, t.name, token)
	t.release(h, func(ctx context.Context) error {
		err := e.Resign(ctx)
		if errors.Is(err, dlock.ErrNotHeld) && h.isLost() {
			return fmt.Errorf("%w: %w", dlock.ErrLost, err)
		}
		return err
	})
}
