package dlock

import (
	"context"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/dlock-go/dlock/internal/wait"

	"github.com/dlock-go/dlock/internal/lease"
	"github.com/dlock-go/dlock/internal/telemetry"
	"github.com/dlock-go/dlock/internal/wire"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/coalesce"
	"github.com/dlock-go/dlock/internal/pubsub"
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
	err     error  // set by New for a nil client or a bad option
	cluster bool   // scripts must then be batched per hash slot

	co    *coalesce.Coalescer // shares round trips between concurrent calls; nil on a cluster
	hub   *pubsub.Hub
	waits *wait.Registry
	loop  *wait.Loop // how blocking calls wait (see internal/wait)
	wd    *lease.Watchdog
	tel   *telemetry.Telemetry

	holdsMu sync.Mutex
	holds   map[string]*lease.Hold // counted holds, by holdKey(key, owner)
	gates   map[string]*ownerGate  // serializes each owner's calls, by holdKey

	waiterSeq atomic.Uint64   // numbers waiters that have no ID of their own
	renewals  *lease.Renewals // how the watchdog's renewals reach Redis

	closed    atomic.Bool
	closeOnce sync.Once

	hooks  *testHooks // nil outside tests
	outage *lease.Outage
}

// testHooks let internal tests stop a Client at the points where a race
// they reproduce happens. Each is called, when set, on the goroutine that
// reaches the point.
type testHooks struct {
	beforeCohortRelease func() // Mutex.release: a cohort's local waiters were queued for the releasing script
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
	c := &Client{rdb: rdb, cfg: cfg, id: wire.NewClientID(cfg.name), err: cfg.err, holds: make(map[string]*lease.Hold), gates: make(map[string]*ownerGate)}
	c.tel = telemetry.New(cfg.tracerProvider, cfg.meterProvider, cfg.nameAttr)
	if isNil(rdb) {
		c.err = invalidf("nil redis client")
	}
	if c.err == nil {
		c.err = checkSyncReplicas(rdb, cfg.sync)
	}
	if c.err != nil {
		c.closed.Store(true)
		return c
	}
	_, c.cluster = rdb.(*redis.ClusterClient)
	if !c.cluster {
		// Not on a cluster: go-redis retries a whole pipeline when its first
		// command fails with TRYAGAIN (a resharding slot), which would run
		// the other commands in it twice.
		c.co = coalesce.New(rdb, pipelinesInFlight)
	}
	c.waits = wait.NewRegistry()
	c.hub = pubsub.New(rdb, hubHandler{c}, pubsub.Options{Linger: subscriptionLinger, Logger: cfg.logger})
	c.renewals = lease.NewRenewals(rdb)
	c.outage = &lease.Outage{Log: cfg.logger}
	c.wd = lease.NewWatchdog(cfg.watchdog, c.renewals.Send, c.cluster, c.tel, c.outage)
	c.loop = &wait.Loop{Reg: c.waits, Hub: c.hub, Tel: c.tel, Timeout: cfg.watchdog}
	return c
}

func isNil(rdb redis.UniversalClient) bool {
	if rdb == nil {
		return true
	}
	v := reflect.ValueOf(rdb)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// ID returns the Client's ID: its name (see WithClientName), escaped, a '~'
// and a random part. It starts every holder and waiter ID the Client writes
// to Redis, which is how inspection (see Status) names a lock's holder.
func (c *Client) ID() string { return c.id }

// Name returns the Client's name: see WithClientName.
func (c *Client) Name() string { return c.cfg.name }

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
		c.waits.Close()
		c.wd.Close()
		c.renewals.Close()
		err = c.hub.Close()
	})
	return err
}

// hubHandler turns pub/sub events into wake-ups of local waiters.
type hubHandler struct{ c *Client }

// Message wakes waiters after a release elsewhere. A release by this Client
// already woke its local waiter directly, so its echo is ignored.
func (h hubHandler) Message(channel, payload string) {
	m := wire.DecodeRelease(payload)
	if m.From == h.c.id {
		return // the sender woke its own waiters
	}
	h.c.waits.Wake(channel, m.Wake, wait.WakeRelease)
}

// Subscribed wakes every waiter on channel: any release before the
// confirmation may have been missed, so each must look again.
func (h hubHandler) Subscribed(channel string) {
	h.c.waits.Wake(channel, wire.WakeAll, wait.WakeSubscribed)
}

// script runs one of dlock's scripts. A call whose ctx cannot be cancelled
// shares a pipeline with other calls of this Client in flight at the same
// moment (see internal/coalesce); one with a cancellable ctx goes alone, so
// that its ctx still applies. With WithSyncReplicas, a try's script (its
// ctx made by acquisition.tryCtx) goes with a WAIT behind it instead.
func (c *Client) script(ctx context.Context, s *redis.Script, keys []string, args ...any) *redis.Cmd {
	if c.cfg.sync.replicas > 0 {
		if ack, _ := ctx.Value(ackKey{}).(*replicaAck); ack != nil {
			return c.scriptAcked(ctx, ack, s, keys, args)
		}
	}
	var cmd *redis.Cmd
	if c.co == nil || ctx.Done() != nil {
		cmd = s.Run(ctx, c.rdb, keys, args...)
	} else {
		cmd = c.co.Run(ctx, s, keys, args...)
	}
	c.outage.Saw(cmd.Err())
	return cmd
}

// do sends cmd as script sends a script call, and returns cmd.Err().
func (c *Client) do(ctx context.Context, cmd redis.Cmder) error {
	if c.co == nil || ctx.Done() != nil {
		return c.rdb.Process(ctx, cmd)
	}
	return c.co.Do(ctx, cmd)
}

// waiterID returns an ID for a waiter that has none of its own, unique in
// this Client (no token or permit ID can look like it).
func (c *Client) waiterID() string {
	return "#" + strconv.FormatUint(c.waiterSeq.Add(1), 10)
}
