package dlock

import (
	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/engine"
	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/telemetry"
	"github.com/dlock-go/dlock/internal/wire"
)

// Client is the entry point: it makes lock handles and owns the machinery
// they share, one watchdog goroutine that renews leases and one pub/sub
// connection on which blocked callers wait. Make one Client per process (or
// per Redis deployment) and share it; all its methods are safe for
// concurrent use.
type Client struct {
	core   *engine.Core
	name   string       // WithClientName
	chains permitChains // its semaphores' running permit cohorts (permit.go)
}

// New returns a Client on rdb, which may be a *redis.Client, a
// *redis.ClusterClient, a failover (Sentinel) client or a *redis.Ring
// restricted to one shard per lock. dlock does not close rdb.
//
// New never fails. A nil rdb or an invalid option makes every later call
// return an error wrapping ErrInvalid, and nothing is sent to Redis.
// Close the Client when done to stop its goroutines.
func New(rdb redis.UniversalClient, opts ...Option) *Client {
	cfg := buildConfig(opts)
	err := cfg.err
	if err == nil && engine.IsNilClient(rdb) {
		err = errs.Invalidf("nil redis client")
	}
	tel := telemetry.New(cfg.tracerProvider, cfg.meterProvider, cfg.nameAttr)
	return &Client{core: engine.New(rdb, cfg.Config, tel, wire.NewClientID(cfg.name), err), name: cfg.name}
}

// ID returns the Client's ID: its name (see WithClientName), escaped, a '~'
// and a random part. It starts every holder and waiter ID the Client writes
// to Redis, which is how inspection (see Status) names a lock's holder.
func (c *Client) ID() string { return c.core.ID }

// Name returns the Client's name: see WithClientName.
func (c *Client) Name() string { return c.name }

// Close stops the watchdog and the pub/sub connection and waits for their
// goroutines to exit. Blocked calls return ErrClosed, and later calls fail
// with ErrClosed.
//
// Close does not release held locks: with no one renewing them, they expire
// by their lease. Every hold still open is reported lost (its Lost channel
// closes and its hold context is cancelled with a cause matching both ErrLost
// and ErrClosed), because the Client no longer keeps it. Close is idempotent.
func (c *Client) Close() error { return c.core.Close() }
