package dlock

import (
	"context"
	"crypto/rand"
	"reflect"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/coalesce"
	"github.com/dlock-go/dlock/pubsub"
)

// Client is the entry point: it makes lock handles and owns the machinery
// they share, one watchdog goroutine that renews leases and one pub/sub
// connection on which blocked callers wait. Make one Client per process (or
// per Redis deployment) and share it; all its methods are safe for
// concurrent use.
type Client struct {
	rdb     redis.UniversalClient
	cfg     config
	id      string // random; prefixes every owner ID and tags release messages
	oneMsg  string // the release message that wakes one waiter
	err     error  // set by New for a nil client or a bad option
	cluster bool   // scripts must then be batched per hash slot

	co    *coalesce.Coalescer // shares round trips between concurrent calls; nil on a cluster
	hub   *pubsub.Hub
	waits waitRegistry
	wd    *watchdog
	tel   *telemetry

	holdsMu sync.Mutex
	holds   map[string]*lease     // reentrant holds, by holdKey(key, owner)
	gates   map[string]*ownerGate // serializes each owner's calls, by holdKey

	closed    atomic.Bool
	closeOnce sync.Once
}

// New returns a Client on rdb, which may be a *redis.Client, a
// *redis.ClusterClient, a failover (Sentinel) client or a *redis.Ring
// restricted to one shard per lock. dlock does not close rdb.
//
// New never fails. A nil rdb or an invalid option makes every later call
// return an error wrapping ErrInvalid, and nothing is sent to Redis.
// Close the Client when done to stop its goroutines.
func New(rdb redis.UniversalClient, opts ...Option) *Client {
	cfg := defaultConfig()
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	c := &Client{rdb: rdb, cfg: cfg, id: rand.Text(), err: cfg.err, holds: make(map[string]*lease), gates: make(map[string]*ownerGate)}
	c.tel = newTelemetry(&cfg)
	if isNil(rdb) {
		c.err = invalidf("nil redis client")
	}
	if c.err != nil {
		c.closed.Store(true)
		return c
	}
	_, c.cluster = rdb.(*redis.ClusterClient)
	c.oneMsg = c.id + "|1"
	if !c.cluster {
		// Not on a cluster: go-redis retries a whole pipeline when its first
		// command fails with TRYAGAIN (a resharding slot), which would run
		// the other commands in it twice.
		c.co = coalesce.New(rdb, pipelinesInFlight)
	}
	c.waits.init()
	c.hub = pubsub.New(rdb, hubHandler{c}, pubsub.Options{Linger: subscriptionLinger, Logger: cfg.logger})
	c.wd = newWatchdog(c)
	return c
}

func isNil(rdb redis.UniversalClient) bool {
	if rdb == nil {
		return true
	}
	v := reflect.ValueOf(rdb)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// ID returns the Client's random ID, which prefixes the owner IDs it writes to
// Redis. It helps to tell processes apart when inspecting keys.
func (c *Client) ID() string { return c.id }

// Close stops the watchdog and the pub/sub connection and waits for their
// goroutines to exit. Blocked calls return ErrClosed, and later calls fail
// with ErrClosed.
//
// Close does not release held locks: with no one renewing them, they expire
// by their lease. Every hold still open is reported lost (its Lost channel
// closes and its hold context is cancelled with a cause matching both ErrLost
// and ErrClosed), because the Client no longer keeps it. Close is idempotent.
func (c *Client) Close() error {
	if c.err != nil {
		return nil
	}
	var err error
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		c.waits.close()
		c.wd.close()
		err = c.hub.Close()
	})
	return err
}

// usable reports the error a call must return before touching Redis: a bad
// Client or handle, or a closed Client.
func (c *Client) usable(handleErr error) error {
	switch {
	case c.err != nil:
		return c.err
	case handleErr != nil:
		return handleErr
	case c.closed.Load():
		return ErrClosed
	}
	return nil
}

// hubHandler turns pub/sub events into wake-ups of local waiters.
type hubHandler struct{ c *Client }

// Message wakes waiters after a release elsewhere. A release by this Client
// already woke its local waiter directly, so its echo is ignored.
func (h hubHandler) Message(channel, payload string) {
	from, spec := parseRelease(payload)
	if from == h.c.id {
		return
	}
	h.c.waits.wake(channel, spec, wakeRelease)
}

// Subscribed wakes every waiter on channel: any release before the
// confirmation may have been missed, so each must look again.
func (h hubHandler) Subscribed(channel string) {
	h.c.waits.wake(channel, wakeSpec{}, wakeSubscribed)
}

// ownerGate orders the calls of one owner on one lock through this Client, so
// that the results of its round trips are recorded in the order the server
// applied them.
type ownerGate struct {
	mu   sync.Mutex
	refs int // guarded by Client.holdsMu
}

// gate locks the gate of hk and returns its unlock.
func (c *Client) gate(hk string) (unlock func()) {
	c.holdsMu.Lock()
	g := c.gates[hk]
	if g == nil {
		g = &ownerGate{}
		c.gates[hk] = g
	}
	g.refs++
	c.holdsMu.Unlock()
	g.mu.Lock()
	return func() {
		g.mu.Unlock()
		c.holdsMu.Lock()
		if g.refs--; g.refs == 0 {
			delete(c.gates, hk)
		}
		c.holdsMu.Unlock()
	}
}

// detach returns ctx without its cancellation, so that a request's outcome
// is always known; ctx's values (trace spans) remain. A ctx that cannot be
// cancelled is returned as it is.
func detach(ctx context.Context) context.Context {
	if ctx.Done() == nil {
		return ctx
	}
	return context.WithoutCancel(ctx)
}

// script runs one of dlock's scripts. A call whose ctx cannot be cancelled
// shares a pipeline with other calls of this Client in flight at the same
// moment (see internal/coalesce); one with a cancellable ctx goes alone, so
// that its ctx still applies.
func (c *Client) script(ctx context.Context, s *redis.Script, keys []string, args ...any) *redis.Cmd {
	if c.co == nil || ctx.Done() != nil {
		return s.Run(ctx, c.rdb, keys, args...)
	}
	return c.co.Run(ctx, s, keys, args...)
}

// do sends cmd as script sends a script call, and returns cmd.Err().
func (c *Client) do(ctx context.Context, cmd redis.Cmder) error {
	if c.co == nil || ctx.Done() != nil {
		return c.rdb.Process(ctx, cmd)
	}
	return c.co.Do(ctx, cmd)
}
