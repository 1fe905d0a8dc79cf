package dlock

import (
	"context"
	"strconv"
	"time"

	"github.com/dlock-go/dlock/scripts"
)

// CountDownLatch lets callers wait until a count, shared across processes,
// reaches zero. TrySetCount starts it; each CountDown takes one off; Await
// returns once it is zero. At zero the latch is free to be set again.
//
// The latch is a Redis hash holding the count and a generation number; it
// persists with no expiry. Make one with
// Client.CountDownLatch.
type CountDownLatch struct {
	c       *Client
	name    string
	key     string
	channel string
	err     error
}

// CountDownLatch returns a handle on the latch called name. It sends nothing
// to Redis. An empty name makes every method return an error wrapping
// ErrInvalid.
func (c *Client) CountDownLatch(name string) *CountDownLatch {
	key := lockKey(c.cfg.prefix, name)
	return &CountDownLatch{c: c, name: name, key: key, channel: channelOf(key), err: checkName(name)}
}

// Name returns the latch's name, without the key prefix.
func (l *CountDownLatch) Name() string { return l.name }

// TrySetCount sets the count to n if the latch is at zero, and reports
// whether it did. n must be at least 1.
func (l *CountDownLatch) TrySetCount(ctx context.Context, n int64) (bool, error) {
	if err := l.c.usable(l.err); err != nil {
		return false, err
	}
	if n < 1 {
		return false, invalidf("latch %q: count %d", l.name, n)
	}
	v, err := l.c.script(ctx, scripts.LatchSet, []string{l.key}, n).Int64()
	if err != nil {
		return false, redisErr("trysetcount", l.name, l.key, err)
	}
	return v == 1, nil
}

// CountDown takes one off the count. At zero it wakes every Await; at zero
// already it does nothing.
func (l *CountDownLatch) CountDown(ctx context.Context) (err error) {
	ctx, sp := l.c.tel.start(ctx, kindLatchName, "dlock.CountDownLatch.CountDown", l.name, -1)
	defer func() { sp.endOther(err) }()
	if err := l.c.usable(l.err); err != nil {
		return err
	}
	n, err := l.c.script(ctx, scripts.LatchCountDown, []string{l.key, l.channel}, l.c.id).Int64()
	if err != nil {
		l.c.wakeUnknown(l.channel, err)
		return redisErr("countdown", l.name, l.key, err)
	}
	if n == 0 {
		l.c.waits.wake(l.channel, wakeSpec{}, wakeLocal)
	}
	return nil
}

// Count returns the current count; 0 when the latch is not set.
func (l *CountDownLatch) Count(ctx context.Context) (int64, error) {
	if err := l.c.usable(l.err); err != nil {
		return 0, err
	}
	n, _, err := l.state(ctx)
	return n, err
}

// state reads the count (0 when not counting) and the generation, which
// grows by one each time the count reaches zero.
func (l *CountDownLatch) state(ctx context.Context) (count, gen int64, err error) {
	v, err := l.c.rdb.HMGet(ctx, l.key, "count", "gen").Result()
	if err != nil {
		return 0, 0, redisErr("count", l.name, l.key, err)
	}
	parse := func(x any) int64 {
		s, _ := x.(string)
		n, _ := strconv.ParseInt(s, 10, 64)
		return n
	}
	return parse(v[0]), parse(v[1]), nil
}

// Await blocks until the count is zero, ctx ends, or the Client closes. A
// latch that is not set is at zero. A zero reached while Await waits counts
// even if the latch was set again before Await looked. The final CountDown's message wakes it;
// a lost message or dropped connection delays it at most until the next
// re-subscription or the watchdog timeout. When ctx ends first it returns an
// error matching both ErrNotObtained and ctx.Err().
func (l *CountDownLatch) Await(ctx context.Context) (err error) {
	ctx, sp := l.c.tel.start(ctx, kindLatchName, "dlock.CountDownLatch.Await", l.name, -1)
	defer func() { sp.endAcquire(err, err == nil, true) }()
	if err := l.c.usable(l.err); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return notObtained("await", l.name, ctx)
	}
	count, gen0, err := l.state(ctx)
	if err != nil || count <= 0 {
		return err
	}
	try := func() (bool, time.Duration, error) {
		count, gen, err := l.state(ctx)
		if err != nil && ctx.Err() != nil {
			return false, 0, notObtained("await", l.name, ctx)
		}
		return err == nil && (count <= 0 || gen != gen0), 0, err
	}
	return l.c.wait(ctx, "await", l.name, l.channel, waitAs{metric: kindLatchName}, 0, try)
}
