package redisson

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/errs"
)

const kindSem = "redisson.semaphore"

// Semaphore is a handle on a Redisson RSemaphore: a count of permits in the
// string at name, taken and given back by anyone (permits have no owner),
// with redisson_sc:{name} carrying the count after each release. Java
// acquirers wake only on that message, so every Release here publishes it.
// Permits are not returned when a process dies: like Java's, they are
// counted, not held.
type Semaphore struct {
	c    *Client
	name string
}

// Semaphore returns the handle of the RSemaphore called name.
func (c *Client) Semaphore(name string) *Semaphore { return &Semaphore{c: c, name: name} }

// Name returns the semaphore's name.
func (s *Semaphore) Name() string { return s.name }

func (s *Semaphore) check(op string, n int64, min int64) error {
	if err := s.c.check(op, s.name); err != nil {
		return err
	}
	if n < min {
		return errs.Op(op, s.name, "", errs.Invalidf("%d permits", n))
	}
	return nil
}

// TrySetPermits sets the number of permits if the semaphore does not exist
// yet, and reports whether it did (Java's trySetPermits), publishing the
// count. A negative count is dlock.ErrInvalid.
func (s *Semaphore) TrySetPermits(ctx context.Context, permits int64) (bool, error) {
	if err := s.check("trysetpermits", permits, 0); err != nil {
		return false, err
	}
	pub, err := s.c.publishCommand(ctx)
	if err != nil {
		return false, redisErr("trysetpermits", s.name, kindSem, err)
	}
	n, err := scriptSemSet.Run(ctx, s.c.rdb, []string{s.name, semaphoreChannel(s.name)}, permits, pub).Int64()
	if err != nil {
		return false, redisErr("trysetpermits", s.name, kindSem, err)
	}
	return n == 1, nil
}

// TryAcquire takes n permits if that many are available, in one round
// trip, and reports whether it did. A missing semaphore has none. n must be
// positive (dlock.ErrInvalid).
func (s *Semaphore) TryAcquire(ctx context.Context, n int64) (ok bool, err error) {
	if err := s.check("tryacquire", n, 1); err != nil {
		return false, err
	}
	ctx, sp := s.c.tel.Start(ctx, kindSem, "redisson.Semaphore.TryAcquire", s.name, 0)
	defer func() { sp.EndAcquire(err, ok, false) }()
	ok, _, err = s.try(context.WithoutCancel(ctx), n)
	return ok, err
}

func (s *Semaphore) try(ctx context.Context, n int64) (bool, time.Duration, error) {
	r, err := scriptSemTry.Run(ctx, s.c.rdb, []string{s.name}, n).Int64()
	if err != nil {
		return false, 0, redisErr("acquire", s.name, kindSem, err)
	}
	return r == 1, -1, nil
}

// Acquire blocks until it has taken n permits, ctx ends (an error matching
// dlock.ErrNotObtained and ctx.Err(); nothing taken) or the Client closes.
// It waits as Java's acquire does, for release messages, and also re-reads
// the count every third of the watchdog timeout, which Java does not, in
// case a message was lost.
func (s *Semaphore) Acquire(ctx context.Context, n int64) (err error) {
	if err := s.check("acquire", n, 1); err != nil {
		return err
	}
	ctx, sp := s.c.tel.Start(ctx, kindSem, "redisson.Semaphore.Acquire", s.name, 0)
	defer func() { sp.EndAcquire(err, err == nil, true) }()
	return s.c.await(ctx, "acquire", s.name, semaphoreChannel(s.name), s.c.cfg.watchdog/3, func(ctx context.Context) (bool, time.Duration, error) {
		return s.try(ctx, n)
	})
}

// Release adds n permits (taken or not: there is no owner check) and
// publishes the new count, which wakes Java and Go acquirers. n must be
// positive. It is sent even when ctx has ended.
func (s *Semaphore) Release(ctx context.Context, n int64) (err error) {
	if err := s.check("release", n, 1); err != nil {
		return err
	}
	ctx, sp := s.c.tel.Start(ctx, kindSem, "redisson.Semaphore.Release", s.name, 0)
	defer func() { sp.EndRelease(err) }()
	ctx = context.WithoutCancel(ctx)
	pub, err := s.c.publishCommand(ctx)
	if err != nil {
		return redisErr("release", s.name, kindSem, err)
	}
	if err := scriptSemRelease.Run(ctx, s.c.rdb, []string{s.name, semaphoreChannel(s.name)}, n, pub).Err(); err != nil {
		return redisErr("release", s.name, kindSem, err)
	}
	return nil
}

// AvailablePermits returns the permits available now (0 for a missing
// semaphore), in one round trip.
func (s *Semaphore) AvailablePermits(ctx context.Context) (int64, error) {
	return getCount(ctx, s.c, "availablepermits", s.name, kindSem)
}

// getCount reads a Redisson counter string: 0 when missing.
func getCount(ctx context.Context, c *Client, op, name, kind string) (int64, error) {
	if err := c.check(op, name); err != nil {
		return 0, err
	}
	v, err := c.rdb.Get(ctx, name).Result()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, redisErr(op, name, kind, err)
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, errs.Op(op, name, "the key holds a string that is not a count", errs.ErrInvalid)
	}
	return n, nil
}
