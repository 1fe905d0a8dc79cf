package redisson

import (
	"context"
	"time"

	"github.com/dlock-go/dlock/internal/errs"
)

const kindLatch = "redisson.latch"

// CountDownLatch is a handle on a Redisson RCountDownLatch: the count left
// in the string at name, with redisson_countdownlatch__channel__{name}
// (braces always, as Java writes it) carrying 0 when the count reaches zero
// and 1 when a count is set. Java awaiters wake only on the 0, which the
// CountDown that reaches zero publishes.
type CountDownLatch struct {
	c    *Client
	name string
}

// CountDownLatch returns the handle of the RCountDownLatch called name.
func (c *Client) CountDownLatch(name string) *CountDownLatch {
	return &CountDownLatch{c: c, name: name}
}

// Name returns the latch's name.
func (l *CountDownLatch) Name() string { return l.name }

// TrySetCount sets the count if the latch does not exist (a latch whose
// count reached zero does not), publishes 1 and reports whether it did
// (Java's trySetCount). The count must be positive (dlock.ErrInvalid).
func (l *CountDownLatch) TrySetCount(ctx context.Context, count int64) (bool, error) {
	if err := l.c.check("trysetcount", l.name); err != nil {
		return false, err
	}
	if count < 1 {
		return false, errs.Op("trysetcount", l.name, "", errs.Invalidf("count %d", count))
	}
	pub, err := l.c.publishCommand(ctx)
	if err != nil {
		return false, redisErr("trysetcount", l.name, kindLatch, err)
	}
	n, err := scriptLatchSet.Run(ctx, l.c.rdb, []string{l.name, latchChannel(l.name)}, count, pub).Int64()
	if err != nil {
		return false, redisErr("trysetcount", l.name, kindLatch, err)
	}
	return n == 1, nil
}

// CountDown takes one from the count; the one that reaches zero deletes
// the latch and publishes 0, which wakes every awaiter, Java's and Go's.
// On a missing latch it does nothing. It is sent even when ctx has ended.
func (l *CountDownLatch) CountDown(ctx context.Context) error {
	if err := l.c.check("countdown", l.name); err != nil {
		return err
	}
	ctx = context.WithoutCancel(ctx)
	pub, err := l.c.publishCommand(ctx)
	if err != nil {
		return redisErr("countdown", l.name, kindLatch, err)
	}
	if err := scriptLatchDown.Run(ctx, l.c.rdb, []string{l.name, latchChannel(l.name)}, pub).Err(); err != nil {
		return redisErr("countdown", l.name, kindLatch, err)
	}
	return nil
}

// Count returns the count left, 0 for a missing latch, in one round trip.
func (l *CountDownLatch) Count(ctx context.Context) (int64, error) {
	return getCount(ctx, l.c, "count", l.name, kindLatch)
}

// Await blocks until the count is zero (at once for a missing latch), ctx
// ends (an error matching dlock.ErrNotObtained and ctx.Err()) or the
// Client closes. It re-reads the count on every message and, unlike Java,
// also every third of the watchdog timeout.
func (l *CountDownLatch) Await(ctx context.Context) (err error) {
	if err := l.c.check("await", l.name); err != nil {
		return err
	}
	ctx, sp := l.c.tel.Start(ctx, kindLatch, "redisson.CountDownLatch.Await", l.name, 0)
	defer func() { sp.EndOther(err) }()
	return l.c.await(ctx, "await", l.name, latchChannel(l.name), l.c.cfg.watchdog/3, func(ctx context.Context) (bool, time.Duration, error) {
		n, err := l.Count(ctx)
		return n <= 0, -1, err
	})
}
