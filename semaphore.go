package dlock

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/dlock-go/dlock/scripts"
)

// Semaphore is a distributed counting semaphore whose permits are leases.
// Acquire hands out a Permit for n permits; the watchdog renews it while it
// is held (or it expires after WithPermitLease), so a crashed holder's
// permits come back when its lease runs out, measured on the Redis server's
// clock. A Permit has the same lost signal as a lock.
//
// Waiters are served in arrival order, across all Clients: a request may
// take permits only if the free ones also cover every request queued ahead
// of it. A large request is therefore never starved by a stream of small
// ones; the price is that a small request waits behind a large one even when
// it alone would fit, as with golang.org/x/sync/semaphore.
//
// The total is set once with TrySetPermits (or changed with AddPermits); it
// persists in Redis with no expiry. Make one with Client.Semaphore.
type Semaphore struct {
	c       *Client
	name    string
	keys    []string // M, H, C, Q, QE: see scripts/sem_common.lua
	keysCh  []string // keys and the channel
	channel string
	lease   time.Duration // 0: watchdog
	err     error
}

// SemaphoreOption configures a Semaphore handle.
type SemaphoreOption func(*Semaphore)

// WithPermitLease gives every Permit taken through the handle a fixed lease
// of d, never renewed. d must be positive. Without it the watchdog renews
// permits until they are released.
func WithPermitLease(d time.Duration) SemaphoreOption {
	return func(s *Semaphore) {
		if d <= 0 {
			s.err = invalidf("permit lease %v is not positive", d)
			return
		}
		s.lease = d
	}
}

// Semaphore returns a handle on the semaphore called name. It sends nothing
// to Redis. An empty name or an invalid option makes every method return an
// error wrapping ErrInvalid.
func (c *Client) Semaphore(name string, opts ...SemaphoreOption) *Semaphore {
	m := lockKey(c.cfg.prefix, name)
	keys := []string{m, m + ":h", m + ":c", m + ":q", m + ":qe"}
	ch := channelOf(m)
	s := &Semaphore{c: c, name: name, keys: keys, keysCh: append(keys[:5:5], ch), channel: ch, err: checkName(name)}
	for _, o := range opts {
		if o != nil && s.err == nil {
			o(s)
		}
	}
	return s
}

// Name returns the semaphore's name, without the key prefix.
func (s *Semaphore) Name() string { return s.name }

// TrySetPermits sets the total number of permits to n if it was never set,
// and reports whether it did. n must be at least 1.
func (s *Semaphore) TrySetPermits(ctx context.Context, n int) (bool, error) {
	if err := s.c.usable(s.err); err != nil {
		return false, err
	}
	if n < 1 {
		return false, invalidf("semaphore %q: %d permits", s.name, n)
	}
	changed, err := s.permits(ctx, "set", n)
	return changed, err
}

// AddPermits adds n permits to the total; a negative n removes them. It
// fails with ErrInvalid, changing nothing, when the total would drop below
// zero. Permits in use are not revoked: lowering the total below them makes
// Available negative until enough are released. Waiters the new permits can
// serve are woken.
func (s *Semaphore) AddPermits(ctx context.Context, n int) error {
	if err := s.c.usable(s.err); err != nil {
		return err
	}
	_, err := s.permits(ctx, "add", n)
	return err
}

func (s *Semaphore) permits(ctx context.Context, op string, n int) (bool, error) {
	res, err := s.c.script(ctx, scripts.SemPermits, s.keysCh, op, n, s.c.id).Slice()
	if err != nil {
		if strings.HasPrefix(err.Error(), "DLOCK_NEGATIVE") {
			return false, invalidf("semaphore %q: %s", s.name, strings.TrimPrefix(err.Error(), "DLOCK_NEGATIVE "))
		}
		return false, redisErr("permits", s.name, s.keys[0], err)
	}
	changed, msg, err := pair(res)
	if err != nil {
		return false, fmt.Errorf("dlock: permits %q: %w", s.name, err)
	}
	s.wakeLocal(msg)
	return changed == 1, nil
}

// Available returns the number of free permits: the total less the permits
// held by live leases. Expired leases count as free. It is negative after
// AddPermits lowered the total below the permits in use.
func (s *Semaphore) Available(ctx context.Context) (int, error) {
	if err := s.c.usable(s.err); err != nil {
		return 0, err
	}
	n, err := s.c.script(ctx, scripts.SemAvailable, s.keysCh, s.c.id).Int()
	if err != nil {
		return 0, redisErr("available", s.name, s.keys[0], err)
	}
	return n, nil
}

// Acquire blocks until it holds n permits, ctx ends, or the Client closes,
// and returns them as a Permit to Release. Requests are served in arrival
// order (see Semaphore). n must be between 1 and the total. When ctx ends
// first it returns an error matching both ErrNotObtained and ctx.Err(),
// leaves the queue, and takes nothing.
func (s *Semaphore) Acquire(ctx context.Context, n int) (p *Permit, err error) {
	ctx, sp := s.c.tel.start(ctx, kindSemaphoreName, "dlock.Semaphore.Acquire", s.name, s.lease)
	defer func() { sp.endAcquire(err, err == nil, true) }()
	if err := s.check(n); err != nil {
		return nil, err
	}
	if ctx.Err() != nil {
		return nil, notObtained("acquire", s.name, ctx)
	}
	id := rand.Text()
	markTTL := s.c.cfg.watchdog
	try := func() (bool, time.Duration, error) {
		var left time.Duration
		var err error
		p, left, err = s.attempt(ctx, id, n, markTTL)
		return p != nil, left, err
	}
	ok, left, err := try()
	if err != nil || ok {
		return p, err
	}
	// The request is queued; the watchdog keeps its place while it waits, and
	// a crashed waiter's place is given up when its mark runs out.
	mark := newLease(ctx, kindSemaphoreName, s.name, s.keys[4], "z"+id, true, markTTL, time.Now())
	mark.mark = true
	if !s.c.wd.add(mark) {
		s.cancel(ctx, id)
		return nil, closedErr("acquire", s.name)
	}
	err = s.c.wait(ctx, "acquire", s.name, s.channel, waitAs{id: id, metric: kindSemaphoreName}, left, try)
	s.c.wd.dropped(mark)
	if err != nil {
		s.cancel(ctx, id)
		return nil, err
	}
	return p, nil
}

// TryAcquire takes n permits if they are free and nobody is queued ahead,
// in one round trip. When they are not, it returns an error matching
// ErrNotObtained.
func (s *Semaphore) TryAcquire(ctx context.Context, n int) (p *Permit, err error) {
	ctx, sp := s.c.tel.start(ctx, kindSemaphoreName, "dlock.Semaphore.TryAcquire", s.name, s.lease)
	defer func() { sp.endAcquire(err, p != nil, false) }()
	if err := s.check(n); err != nil {
		return nil, err
	}
	if ctx.Err() != nil {
		return nil, notObtained("tryacquire", s.name, ctx)
	}
	p, _, err = s.attempt(ctx, rand.Text(), n, 0)
	if err == nil && p == nil {
		err = fmt.Errorf("dlock: tryacquire %q: %d permits: %w", s.name, n, ErrNotObtained)
	}
	return p, err
}

func (s *Semaphore) check(n int) error {
	if err := s.c.usable(s.err); err != nil {
		return err
	}
	if n < 1 {
		return invalidf("semaphore %q: acquire %d permits", s.name, n)
	}
	return nil
}

// attempt makes one try for n permits under id, queueing when markTTL > 0.
// It returns the Permit on success, else how long until a lease may run out.
func (s *Semaphore) attempt(ctx context.Context, id string, n int, markTTL time.Duration) (*Permit, time.Duration, error) {
	ttl, renew := s.c.leaseOf(lockConfig{lease: s.lease})
	nc := detach(ctx)
	sent := time.Now()
	v, err := s.c.script(nc, scripts.SemTry, s.keysCh, id, n, millis(ttl), millis(markTTL), s.c.id).Int64()
	if err != nil {
		if strings.HasPrefix(err.Error(), "DLOCK_TOOMANY") {
			return nil, 0, invalidf("semaphore %q: %s", s.name, strings.TrimPrefix(err.Error(), "DLOCK_TOOMANY "))
		}
		if !isRedisError(err) {
			// The permit ID is unique to this request: giving it back is
			// safe whether or not the lost reply had granted it.
			s.giveBack(nc, id)
		}
		return nil, 0, redisErr("acquire", s.name, s.keys[0], err)
	}
	if v < 1 {
		return nil, time.Duration(-v) * time.Millisecond, nil
	}
	if ctx.Err() != nil {
		s.giveBack(nc, id)
		return nil, 0, notObtained("acquire", s.name, ctx)
	}
	annotate(ctx, attrPermits.Int(n))
	p := &Permit{s: s, id: id, n: n, l: newLease(ctx, kindSemaphoreName, s.name, s.keys[1], "z"+id, renew, ttl, sent)}
	if !s.c.wd.add(p.l) {
		s.giveBack(nc, id)
		return nil, 0, closedErr("acquire", s.name)
	}
	return p, 0, nil
}

// release returns the permits of id and wakes the local waiters they serve.
// It returns how many permits it returned, -1 when id held none.
func (s *Semaphore) release(ctx context.Context, id string) (int64, error) {
	res, err := s.c.script(ctx, scripts.SemRelease, s.keysCh, id, s.c.id).Slice()
	if err != nil {
		s.c.wakeUnknown(s.channel, err)
		return 0, redisErr("release", s.name, s.keys[0], err)
	}
	n, msg, err := pair(res)
	if err != nil {
		return 0, fmt.Errorf("dlock: release %q: %w", s.name, err)
	}
	s.wakeLocal(msg)
	return n, nil
}

// giveBack releases a grant the caller will not get, and leaves the queue.
func (s *Semaphore) giveBack(ctx context.Context, id string) {
	_, _ = s.release(ctx, id)
	s.cancel(ctx, id)
}

// cancel takes waiter id out of the queue. Best effort: a place left behind
// is dropped when its waiting mark runs out.
func (s *Semaphore) cancel(ctx context.Context, id string) {
	msg, err := s.c.script(detach(ctx), scripts.SemCancel, s.keysCh, id, s.c.id).Text()
	if err != nil {
		s.c.wakeUnknown(s.channel, err)
		return
	}
	s.wakeLocal(msg)
}

func (s *Semaphore) wakeLocal(msg string) {
	if msg != "" {
		_, spec := parseRelease(msg)
		s.c.waits.wake(s.channel, spec, wakeLocal)
	}
}

// pair decodes a script's {integer, message} reply.
func pair(res []any) (int64, string, error) {
	if len(res) != 2 {
		return 0, "", fmt.Errorf("unexpected reply %v", res)
	}
	n, ok := res[0].(int64)
	msg, ok2 := res[1].(string)
	if !ok || !ok2 {
		return 0, "", fmt.Errorf("unexpected reply %v", res)
	}
	return n, msg, nil
}

// Permit is a grant of permits from a Semaphore: a lease, renewed by the
// watchdog unless WithPermitLease fixed it. Release it exactly once. A
// Permit's methods are safe for concurrent use.
type Permit struct {
	s  *Semaphore
	id string
	n  int
	l  *lease

	mu   sync.Mutex
	done bool // Release succeeded, or found the permit gone
}

// Count returns how many permits p holds.
func (p *Permit) Count() int { return p.n }

// Release gives the permits back and wakes the waiters they can serve. A
// second Release, or one after the lease expired, returns an error matching
// ErrNotHeld (and ErrLost, when the lease ran out) and changes no count.
// Like Mutex.Unlock, it runs even when ctx has ended.
func (p *Permit) Release(ctx context.Context) (err error) {
	s := p.s
	ctx, sp := s.c.tel.start(ctx, kindSemaphoreName, "dlock.Permit.Release", s.name, s.lease)
	defer func() { sp.endRelease(err) }()
	annotate(ctx, attrPermits.Int(p.n))
	if err := s.c.usable(nil); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return fmt.Errorf("dlock: release %q: %w", s.name, ErrNotHeld)
	}
	s.c.wd.beginRelease(p.l)
	n, err := s.release(detach(ctx), p.id)
	if err != nil {
		s.c.wd.abortRelease(p.l)
		return err
	}
	p.done = true
	if n < 0 {
		s.c.wd.lose(p.l, fmt.Errorf("%w: permit lease expired before release", ErrLost))
		return fmt.Errorf("dlock: release %q: %w: %w", s.name, ErrLost, ErrNotHeld)
	}
	if cause := s.c.wd.released(p.l); cause != nil {
		return fmt.Errorf("dlock: release %q: %w", s.name, cause)
	}
	return nil
}

// Lost returns a channel that is closed if the permit's lease is lost (it
// expired, renewals failed for a whole lease, or the Client closed). Release
// does not close it.
func (p *Permit) Lost() <-chan struct{} { return p.s.c.wd.lostOf(p.l) }

// HoldContext returns a copy of parent that is cancelled when the permit
// ends: by Release, or by loss, in which case context.Cause reports an error
// matching ErrLost. Call the CancelFunc when done.
func (p *Permit) HoldContext(parent context.Context) (context.Context, context.CancelFunc) {
	return p.s.c.wd.holdContext(parent, p.l)
}
