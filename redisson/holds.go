package redisson

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"time"

	"github.com/dlock-go/dlock"
	"go.opentelemetry.io/otel/trace"

	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/telemetry"
	"github.com/dlock-go/dlock/internal/wire"
)

// holdKind tells which script renews a hold.
type holdKind uint8

const (
	kindLock  holdKind = iota // RLock, RFencedLock: lock_renew
	kindWrite                 // a read-write lock's write half: lock_renew
	kindRead                  // a read-write lock's read half: rw_renew_read
)

// String is the telemetry kind of the primitive a hold of k is of.
func (k holdKind) String() string {
	if k == kindLock {
		return kindName
	}
	return kindRW
}

// holdKey names a hold of this Client: one owner's holds (all its
// re-entries) of one lock.
type holdKey struct {
	kind  holdKind
	name  string
	field string
}

// hold is the Client's record of what an owner holds on a lock: Redisson's
// watchdog entry with its local re-entry count. All its fields are guarded
// by Client.mu.
type hold struct {
	key      holdKey
	count    int           // re-entries this Client granted and has not undone
	lease    time.Duration // the lease a re-entrant unlock keeps (Redisson's internalLockLeaseTime)
	renew    bool          // the watchdog renews it
	deadline time.Time     // when the lease in Redis ends at the latest, as far as this Client knows
	timer    *time.Timer   // fires at deadline for a hold the watchdog does not renew
	token    int64         // the fenced lock's latest token
	since    time.Time     // when the first of its grants was sent

	ended  bool
	lost   chan struct{} // closed when the hold is lost
	cause  error         // why it ended
	nextID int
	onEnd  map[int]func(error)
}

// acquired records one grant of key, sent to Redis at sent with lease (the
// watchdog timeout when renew), and returns the hold.
func (c *Client) acquired(key holdKey, lease time.Duration, renew bool, sent time.Time, token int64) *hold {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.holds[key]
	if h == nil {
		h = &hold{key: key, since: sent, lost: make(chan struct{}), onEnd: map[int]func(error){}}
		if !c.closed {
			c.holds[key] = h
			c.tel.HoldStarted(key.kind.String(), key.name)
		}
	}
	h.count++
	h.token = token
	h.lease = lease
	end := sent.Add(lease)
	if key.kind == kindLock || end.After(h.deadline) {
		// An RLock re-entry sets the TTL to its lease; the read-write halves
		// never shorten it.
		h.deadline = end
	}
	if renew && !h.renew {
		h.renew = true
		if h.timer != nil {
			h.timer.Stop()
			h.timer = nil
		}
	}
	if !h.renew {
		c.armLocked(h)
	}
	if h.renew && !c.running && !c.closed {
		c.running = true
		go c.watchdog()
	}
	return h
}

// armLocked (re)starts the timer that reports a hold lost when its fixed
// lease runs out.
func (c *Client) armLocked(h *hold) {
	if h.timer != nil {
		h.timer.Stop()
	}
	h.timer = time.AfterFunc(time.Until(h.deadline), func() {
		c.lose(h, errs.Op("lease", h.key.name, "the lease ran out", dlock.ErrLost))
	})
}

// released records one release of key: end says Redis released the lock.
// A hold ends with its last release (for a read hold, the owner's last).
func (c *Client) released(key holdKey, end bool) {
	c.mu.Lock()
	h := c.holds[key]
	if h == nil {
		c.mu.Unlock()
		return
	}
	h.count--
	var f func()
	if end || h.count <= 0 {
		f = c.endLocked(h, nil)
	}
	c.mu.Unlock()
	if f != nil {
		f()
	}
}

// lose ends h as lost with cause, unless it has ended already.
func (c *Client) lose(h *hold, cause error) {
	c.mu.Lock()
	var f func()
	if !h.ended {
		f = c.endLocked(h, cause)
	}
	c.mu.Unlock()
	if f != nil {
		f()
	}
}

// loseName ends every hold of this Client on name (of the given kinds) as
// lost: a force unlock ended them.
func (c *Client) loseName(name string, kinds ...holdKind) {
	c.mu.Lock()
	var fs []func()
	for k, h := range c.holds {
		if k.name == name && slices.Contains(kinds, k.kind) {
			fs = append(fs, c.endLocked(h, errs.Op("forceunlock", name, "force-unlocked", dlock.ErrLost)))
		}
	}
	c.mu.Unlock()
	for _, f := range fs {
		f()
	}
}

// endLocked ends h: a nil cause is a release, any other a loss. Its hold
// contexts are cancelled first, then Lost closes (a loss), so that whoever
// Lost wakes finds them done. It returns what must run after Client.mu is
// released (telemetry).
func (c *Client) endLocked(h *hold, cause error) func() {
	if h.ended {
		return func() {}
	}
	h.ended = true
	if c.holds[h.key] == h {
		delete(c.holds, h.key)
	}
	if h.timer != nil {
		h.timer.Stop()
	}
	if cause != nil {
		h.cause = cause
	} else {
		h.cause = errs.Op("unlock", h.key.name, "released", dlock.ErrNotHeld)
	}
	for _, cancel := range h.onEnd {
		cancel(h.cause)
	}
	h.onEnd = nil
	if cause != nil {
		close(h.lost)
	}
	kind, name, since := h.key.kind.String(), h.key.name, h.since
	return func() {
		if cause != nil {
			c.tel.HoldEnded(kind, name, since, telemetry.ResultLost)
			c.tel.HoldLost(kind, name, trace.SpanContext{}, cause)
		} else {
			c.tel.HoldEnded(kind, name, since, telemetry.ResultReleased)
		}
	}
}

// holdOf returns the current hold of key, or nil.
func (c *Client) holdOf(key holdKey) *hold {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.holds[key]
}

// lostOf returns the Lost channel of key's current hold, or nil.
func (c *Client) lostOf(key holdKey) <-chan struct{} {
	if h := c.holdOf(key); h != nil {
		return h.lost
	}
	return nil
}

// holdContext returns a copy of parent cancelled when key's current hold
// ends, with the cause of its end; already cancelled (cause
// dlock.ErrNotHeld) when there is none.
func (c *Client) holdContext(parent context.Context, key holdKey) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	c.mu.Lock()
	h := c.holds[key]
	if h == nil || h.ended {
		c.mu.Unlock()
		cancel(errs.Op("holdcontext", key.name, "", dlock.ErrNotHeld))
		return ctx, func() { cancel(context.Canceled) }
	}
	id := h.nextID
	h.nextID++
	h.onEnd[id] = cancel
	c.mu.Unlock()
	return ctx, func() {
		c.mu.Lock()
		if h.onEnd != nil {
			delete(h.onEnd, id)
		}
		c.mu.Unlock()
		cancel(context.Canceled)
	}
}

// watchdog renews the watchdog holds every third of the watchdog timeout,
// a period counted from the end of the previous pass, as Redisson does,
// until Close.
func (c *Client) watchdog() {
	defer close(c.done)
	period := c.cfg.watchdog / 3
	t := time.NewTimer(period)
	defer t.Stop()
	for {
		select {
		case <-c.closing:
			return
		case <-t.C:
		}
		c.renewAll()
		t.Reset(period)
	}
}

// renewBatch is the most locks one renewal script renews (Redisson's
// lockWatchdogBatchSize).
const renewBatch = 100

// renewAll renews every watchdog hold once: locks and write halves in
// batches of one cluster slot, read halves one by one.
func (c *Client) renewAll() {
	c.mu.Lock()
	var reads []*hold
	bySlot := map[uint16][]*hold{}
	for _, h := range c.holds {
		if !h.renew {
			continue
		}
		if h.key.kind == kindRead {
			reads = append(reads, h)
		} else {
			s := wire.Slot(h.key.name)
			bySlot[s] = append(bySlot[s], h)
		}
	}
	c.mu.Unlock()
	lease := c.cfg.watchdog
	ms := strconv.FormatInt(lease.Milliseconds(), 10)
	for _, hs := range bySlot {
		for batch := range slices.Chunk(hs, renewBatch) {
			keys := make([]string, len(batch))
			args := make([]any, 1, len(batch)+1)
			args[0] = ms
			for i, h := range batch {
				keys[i] = h.key.name
				args = append(args, h.key.field)
			}
			sent := time.Now()
			ctx, cancel := context.WithTimeout(c.ctx, lease/3)
			res, err := scriptLockRenew.Run(ctx, c.rdb, keys, args...).Int64Slice()
			cancel()
			c.tel.Batch(len(batch))
			for i, h := range batch {
				switch {
				case err != nil || i >= len(res):
					c.renewFailed(h, err)
				case res[i] == 1:
					c.renewed(h, sent.Add(lease))
				default:
					c.lose(h, errs.Op("renew", h.key.name, "the hold is gone from Redis", dlock.ErrLost))
				}
			}
		}
	}
	for _, h := range reads {
		sent := time.Now()
		ctx, cancel := context.WithTimeout(c.ctx, lease/3)
		n, err := scriptRWRenewRead.Run(ctx, c.rdb, []string{h.key.name, rwTimeoutPrefix(h.key.name, h.key.field)}, ms, h.key.field).Int64()
		cancel()
		switch {
		case err != nil:
			c.renewFailed(h, err)
		case n == 1:
			c.renewed(h, sent.Add(lease))
		default:
			c.lose(h, errs.Op("renew", h.key.name, "the read hold is gone from Redis", dlock.ErrLost))
		}
	}
}

func (c *Client) renewed(h *hold, deadline time.Time) {
	c.tel.Renewals(1, telemetry.ResultRenewed)
	c.mu.Lock()
	defer c.mu.Unlock()
	if !h.ended && h.renew && deadline.After(h.deadline) {
		h.deadline = deadline
	}
}

// renewFailed reports h lost once renewals have failed for its whole lease.
func (c *Client) renewFailed(h *hold, err error) {
	if errors.Is(err, context.Canceled) && c.ctx.Err() != nil {
		return // closing
	}
	c.tel.Renewals(1, telemetry.ResultFailed)
	c.mu.Lock()
	late := !h.ended && time.Now().After(h.deadline)
	c.mu.Unlock()
	if late {
		c.lose(h, errs.Op("renew", h.key.name, "renewals failed for a whole lease", dlock.ErrLost, err))
	}
}
