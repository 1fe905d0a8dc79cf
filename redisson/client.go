package redisson

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/telemetry"
)

// DefaultWatchdogTimeout is Redisson's default lockWatchdogTimeout: the
// lease of a hold taken without WithLease, renewed every third of it.
const DefaultWatchdogTimeout = 30 * time.Second

// ShardedMode says which kind of pub/sub a Client publishes and subscribes
// with, as Redisson's ClusterServersConfig.shardedSubscriptionMode does.
// Java and Go clients of one lock must use the same kind, or they still
// exclude each other but no longer wake each other (waiters then fall back
// to the holder's lease).
type ShardedMode uint8

const (
	// ShardedAuto is Redisson's default, AUTO: sharded pub/sub (SPUBLISH,
	// SSUBSCRIBE) when the client is a Redis Cluster client
	// (*redis.ClusterClient) and the cluster answers PUBSUB SHARDNUMSUB,
	// as Redis 7 and Valkey do; classic pub/sub otherwise.
	ShardedAuto ShardedMode = iota
	// ShardedOn always uses sharded pub/sub: Redisson's ON.
	ShardedOn
	// ShardedOff always uses classic pub/sub (PUBLISH, SUBSCRIBE):
	// Redisson's OFF, and what Redisson's single-server, sentinel and
	// master/replica configurations always use.
	ShardedOff
)

// Option configures a Client.
type Option func(*config)

type config struct {
	watchdog time.Duration        // default DefaultWatchdogTimeout
	sharded  ShardedMode          // default ShardedAuto
	id       string               // default a random UUID
	subWait  time.Duration        // how long a subscription may take; 7.5 s
	tp       trace.TracerProvider // default the OpenTelemetry global
	mp       metric.MeterProvider // default the OpenTelemetry global
	err      error                // the first invalid option
}

// WithWatchdogTimeout sets the lease of holds taken without WithLease, which
// the Client renews every third of it while they are held: Redisson's
// lockWatchdogTimeout, 30 s by default. Match the Java side's setting. A
// value under 30 ms is invalid: every call then fails with ErrInvalid.
func WithWatchdogTimeout(d time.Duration) Option {
	return func(c *config) {
		if d < 30*time.Millisecond {
			c.fail(errs.Invalidf("watchdog timeout %v under 30ms", d))
			return
		}
		c.watchdog = d
	}
}

// WithShardedMode sets the pub/sub kind (ShardedAuto by default). Set it to
// what the Java side's shardedSubscriptionMode is.
func WithShardedMode(m ShardedMode) Option {
	return func(c *config) {
		if m > ShardedOff {
			c.fail(errs.Invalidf("unknown sharded mode %d", m))
			return
		}
		c.sharded = m
	}
}

// WithClientID sets the client id, the first half of every holder field
// (<client id>:<thread id>). By default it is a random UUID, as a Redisson
// client picks one when it starts. Two Clients with one id are one holder
// for each owner: give each Client its own. An empty id is invalid.
func WithClientID(id string) Option {
	return func(c *config) {
		if id == "" {
			c.fail(errs.Invalidf("empty client id"))
			return
		}
		c.id = id
	}
}

// WithTracerProvider sets where spans go: the OpenTelemetry global by
// default.
func WithTracerProvider(tp trace.TracerProvider) Option { return func(c *config) { c.tp = tp } }

// WithMeterProvider sets where metrics go: the OpenTelemetry global by
// default.
func WithMeterProvider(mp metric.MeterProvider) Option { return func(c *config) { c.mp = mp } }

func (c *config) fail(err error) {
	if c.err == nil {
		c.err = err
	}
}

// Client speaks Redisson's protocol on one Redis deployment. It holds the
// client id, the renewal of watchdog holds (one goroutine, started with the
// first such hold, batching up to 100 locks of one cluster slot per
// script), the choice of pub/sub kind, and the subscriptions its blocked
// calls share: one per channel, and one pub/sub connection for all classic
// channels. A Client is safe for concurrent use. Close it when done.
type Client struct {
	rdb redis.UniversalClient
	cfg config
	tel *telemetry.Telemetry

	ctx     context.Context // cancelled by Close; bounds renewals
	cancel  context.CancelFunc
	closing chan struct{} // closed by Close

	modeMu  sync.Mutex
	decided bool // sharded holds the decision of ShardedAuto
	sharded bool

	mu      sync.Mutex // guards the fields below and every hold's fields
	closed  bool
	holds   map[holdKey]*hold
	running bool          // the watchdog goroutine was started
	done    chan struct{} // closed when the watchdog goroutine returns

	subs subscriptions // shared by the waiting calls
}

// New returns a Client on rdb: a *redis.Client, *redis.ClusterClient or
// *redis.FailoverClient. It sends nothing yet. A nil rdb or an invalid
// option does not panic: every call of the Client's handles then returns an
// error matching dlock.ErrInvalid.
func New(rdb redis.UniversalClient, opts ...Option) *Client {
	cfg := config{watchdog: DefaultWatchdogTimeout, subWait: 7500 * time.Millisecond}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	if rdb == nil {
		cfg.fail(errs.Invalidf("nil redis client"))
	}
	if cfg.id == "" {
		cfg.id = newUUID()
	}
	c := &Client{
		rdb:     rdb,
		cfg:     cfg,
		tel:     telemetry.New(cfg.tp, cfg.mp, false),
		closing: make(chan struct{}),
		holds:   make(map[holdKey]*hold),
		done:    make(chan struct{}),
	}
	c.subs.topics = make(map[string]*topic)
	c.ctx, c.cancel = context.WithCancel(context.Background())
	return c
}

// ID returns the client id, the first half of the Client's holder fields.
func (c *Client) ID() string { return c.cfg.id }

// Close stops the Client: blocked calls return an error matching
// dlock.ErrClosed, renewals stop, and every hold is reported lost (its Lost
// channel closes). As with a Redisson client that shuts down, holds are not
// released in Redis: each ends by its lease, within the watchdog timeout for
// watchdog holds. Close does not close rdb. It is safe to call more than
// once.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	close(c.closing)
	c.cancel()
	var ends []func()
	for _, h := range c.holds {
		ends = append(ends, c.endLocked(h, errs.Op("close", h.key.name, "", dlock.ErrLost, dlock.ErrClosed)))
	}
	running := c.running
	c.mu.Unlock()
	for _, f := range ends {
		f()
	}
	c.subs.close()
	if running {
		<-c.done
	}
	return nil
}

// check returns the error every call starts with: an invalid Client or a
// closed one.
func (c *Client) check(op, name string) error {
	if c.cfg.err != nil {
		return errs.Op(op, name, "", c.cfg.err)
	}
	if name == "" {
		return errs.Op(op, name, "", errs.Invalidf("empty name"))
	}
	select {
	case <-c.closing:
		return errs.ClosedOp(op, name)
	default:
		return nil
	}
}

// field returns the holder field of the owner in ctx:
// <client id>:<thread id> (see threadID).
func (c *Client) field(op, name string, ctx context.Context) (string, error) {
	o, ok := dlock.OwnerFrom(ctx)
	if !ok {
		return "", errs.Op(op, name, "", errs.Invalidf("no owner in the context (see dlock.WithOwner and dlock.WithNewOwner)"))
	}
	if o == "" {
		return "", errs.Op(op, name, "", errs.Invalidf("empty owner in the context"))
	}
	return c.cfg.id + ":" + threadID(o), nil
}

// shardedPubSub reports whether the Client uses sharded pub/sub, deciding
// ShardedAuto once as Redisson does: by probing PUBSUB SHARDNUMSUB on a
// cluster client. A probe that did not reach Redis is retried on the next
// call.
func (c *Client) shardedPubSub(ctx context.Context) (bool, error) {
	switch c.cfg.sharded {
	case ShardedOn:
		return true, nil
	case ShardedOff:
		return false, nil
	}
	if _, ok := c.rdb.(*redis.ClusterClient); !ok {
		return false, nil
	}
	c.modeMu.Lock()
	defer c.modeMu.Unlock()
	if c.decided {
		return c.sharded, nil
	}
	err := c.rdb.Do(ctx, "PUBSUB", "SHARDNUMSUB", "0").Err()
	if err != nil && !errs.IsReply(err) {
		return false, err
	}
	c.decided, c.sharded = true, err == nil
	return c.sharded, nil
}

// publishCommand is the publish command the scripts call.
func (c *Client) publishCommand(ctx context.Context) (string, error) {
	s, err := c.shardedPubSub(ctx)
	if s {
		return "SPUBLISH", err
	}
	return "PUBLISH", err
}

// redisErr maps an error from Redis of op on name (a primitive of kind) to
// dlock's errors.
func redisErr(op, name, kind string, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return errs.Op(op, name, "", err)
	}
	return errs.FromRedis(op, name, kind, name, err)
}

// newUUID returns a random (version 4) UUID in Java's text form.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
