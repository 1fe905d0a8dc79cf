package dlock

import (
	"context"
	"fmt"
	"time"

	"github.com/dlock-go/dlock/internal/engine"
	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/scripts"
	"github.com/dlock-go/dlock/internal/telemetry"
	"github.com/dlock-go/dlock/internal/wait"
	"github.com/dlock-go/dlock/internal/wire"
)

// CountDownLatch lets callers wait until a count, shared across processes,
// reaches zero. TrySetCount starts it; each CountDown takes one off; Await
// returns once it is zero. At zero the latch is free to be set again.
//
// The latch is a Redis hash holding the count and a generation number; it
// persists with no expiry unless WithIdleExpiry says otherwise, and Delete
// removes it. Make one with Client.CountDownLatch.
type CountDownLatch struct {
	h    *engine.Handle
	idle time.Duration
}

// CountDownLatch returns a handle on the latch called name. It sends nothing
// to Redis. An empty name or an invalid option makes every method return an
// error wrapping ErrInvalid.
func (c *Client) CountDownLatch(name string, opts ...LatchOption) *CountDownLatch {
	lc := buildSemConfig(opts, LatchOption.applyLatch)
	return &CountDownLatch{h: c.core.NewHandle(telemetry.KindLatch, name, 0, 0, lc.err), idle: lc.idle}
}

// Name returns the latch's name, without the key prefix.
func (l *CountDownLatch) Name() string { return l.h.Name }

// TrySetCount sets the count to n if the latch is at zero, and reports
// whether it did. n must be between 1 and MaxPermits (Lua numbers are
// doubles; counts beyond it are not exact).
func (l *CountDownLatch) TrySetCount(ctx context.Context, n int64) (bool, error) {
	if err := l.h.Usable(ctx); err != nil {
		return false, err
	}
	if n < 1 || n > MaxPermits {
		return false, errs.Invalidf("latch %q: count %d, not between 1 and MaxPermits (%d)", l.h.Name, n, int64(MaxPermits))
	}
	v, err := l.h.C.Script(ctx, scripts.LatchSet, []string{l.h.Key}, n, wire.Millis(l.idle)).Int64()
	if err != nil {
		return false, l.h.Fail("trysetcount", err)
	}
	return v == 1, nil
}

// CountDown takes one off the count. At zero it wakes every Await; at zero
// already it does nothing.
func (l *CountDownLatch) CountDown(ctx context.Context) (err error) {
	ctx, sp, err := l.h.Begin(ctx, "dlock.CountDownLatch.CountDown")
	defer func() { sp.EndOther(err) }()
	if err != nil {
		return err
	}
	n, err := l.h.C.Script(ctx, scripts.LatchCountDown, []string{l.h.Key, l.h.Channel}, l.h.C.ID).Int64()
	if err != nil {
		l.h.WakeUnknown(err)
		return l.h.Fail("countdown", err)
	}
	if n == 0 {
		l.h.C.Waits.Wake(l.h.Channel, wire.WakeAll, wait.WakeLocal)
	}
	return nil
}

// Count returns the current count; 0 when the latch is not set.
func (l *CountDownLatch) Count(ctx context.Context) (int64, error) {
	if err := l.h.Usable(ctx); err != nil {
		return 0, err
	}
	n, _, err := l.state(ctx)
	return n, err
}

// state reads the count (0 when not counting) and the generation, which
// grows by one each time the count reaches zero, and which a latch deleted
// or expired and set again starts afresh, at a value no earlier incarnation
// had (see internal/scripts/latch_common.lua).
func (l *CountDownLatch) state(ctx context.Context) (count, gen int64, err error) {
	v, err := l.h.C.Script(ctx, scripts.LatchState, []string{l.h.Key}).Int64Slice()
	if err == nil && len(v) != 2 {
		err = fmt.Errorf("unexpected reply %v", v)
	}
	if err != nil {
		return 0, 0, l.h.Fail("count", err)
	}
	return v[0], v[1], nil
}

// Delete deletes the latch, which leaves it at zero: every Await returns.
// It reports whether there was a latch to delete.
func (l *CountDownLatch) Delete(ctx context.Context) (deleted bool, err error) {
	ctx, sp, err := l.h.Begin(ctx, "dlock.CountDownLatch.Delete")
	defer func() { sp.EndOther(err) }()
	if err != nil {
		return false, err
	}
	n, err := l.h.C.Script(engine.Detach(ctx), scripts.LatchDelete, []string{l.h.Key, l.h.Channel}, l.h.C.ID).Int()
	if err != nil {
		l.h.WakeUnknown(err)
		return false, l.h.Fail("delete", err)
	}
	l.h.C.Waits.Wake(l.h.Channel, wire.WakeAll, wait.WakeLocal)
	return n == 1, nil
}

// Await blocks until the count is zero, ctx ends, or the Client closes. A
// latch that is not set is at zero. A zero reached while Await waits counts
// even if the latch was set again before Await looked, and so does a Delete
// or an idle expiry: Await returns even if a TrySetCount made the latch
// count again by then. The final CountDown's (or Delete's) message wakes it;
// a lost message, a dropped connection or an idle expiry delays it at most
// until the next re-subscription or the watchdog timeout. When ctx ends
// first it returns an error matching both ErrNotObtained and ctx.Err().
func (l *CountDownLatch) Await(ctx context.Context) (err error) {
	ctx, sp, err := l.h.BeginAcquire(ctx, "dlock.CountDownLatch.Await", "await")
	defer func() { sp.EndAcquire(err, err == nil, true) }()
	if err != nil {
		return err
	}
	count, gen0, err := l.state(ctx)
	if err != nil || count <= 0 {
		return err
	}
	try := func() (bool, time.Duration, error) {
		count, gen, err := l.state(ctx)
		if err != nil && ctx.Err() != nil {
			return false, 0, errs.NotObtained("await", l.h.Name, ctx)
		}
		return err == nil && (count <= 0 || gen != gen0), 0, err
	}
	return l.h.C.Loop.Wait(ctx, "await", l.h.Name, l.h.Channel, wait.As{Metric: telemetry.KindLatch}, 0, try)
}
