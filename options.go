package dlock

import (
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/dlock-go/dlock/internal/engine"
	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/lease"
	"github.com/dlock-go/dlock/internal/wire"
)

// Defaults. Every default lives here.
const (
	// DefaultKeyPrefix starts every key dlock writes.
	DefaultKeyPrefix = "dlock:"
	// DefaultWatchdogTimeout is the lease of a hold taken without WithLease.
	// The watchdog renews it every third of that while the hold lasts.
	DefaultWatchdogTimeout = 30 * time.Second

	// MinLease is the shortest lease or watchdog timeout dlock accepts
	// (WithLease, WithWatchdogTimeout, WithRenewedLease, WithPermitLease,
	// WithRenewedPermitLease, Extend, ExtendRef). A grant must arrive with a
	// third of its lease left, after the round trip that asked for it and a
	// drift margin of 2ms and 1% of the lease (see Lost holds in the package
	// docs): a shorter lease could never be granted on most networks, and
	// a call that asks for one would try in vain until its context ended.
	MinLease = lease.Min
	// MaxLease is the longest lease or watchdog timeout dlock accepts: a
	// year. Leases are kept in milliseconds on the server and as deadlines
	// on the monotonic clock; a lease meant as "forever" is better a lock
	// that is released.
	MaxLease = lease.Max
	// MaxNameLength is the longest name, in bytes, a primitive may have. A
	// name is part of every key and channel of its primitive, and of error
	// messages (which quote at most the first 128 bytes of it).
	MaxNameLength = wire.MaxNameLength
)

// Option configures a Client. See New.
type Option func(*config)

type config struct {
	engine.Config                       // prefix, watchdog timeout, logger, sync replicas
	tracerProvider trace.TracerProvider // nil: the OpenTelemetry global
	meterProvider  metric.MeterProvider // nil: the OpenTelemetry global
	nameAttr       bool
	name           string // the Client's name, in its ID
	err            error
}

func defaultConfig() config {
	return config{
		Config: engine.Config{Prefix: DefaultKeyPrefix, Watchdog: DefaultWatchdogTimeout, Logger: slog.New(slog.DiscardHandler)},
		name:   wire.DefaultClientName(),
	}
}

// buildConfig applies a Client's options to the defaults.
func buildConfig(opts []Option) config {
	cfg := defaultConfig()
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	return cfg
}

// WithClientName names the Client, so that inspection (Status, the dlock
// command's status and list) and log lines can say which process holds a
// lock. Default: the host name and process ID, "host:pid". The name may be
// any UTF-8 text of up to 128 bytes; it is stored, escaped, in every holder
// and waiter ID the Client writes (see Client.ID), so keep it short. An empty
// name is invalid.
func WithClientName(name string) Option {
	return func(c *config) {
		if err := wire.CheckClientName(name); err != nil {
			c.err = err
			return
		}
		c.name = name
	}
}

// WithKeyPrefix sets the string every key starts with. Default "dlock:". It
// must not contain '{' or '}', which dlock uses for the cluster hash tag.
func WithKeyPrefix(prefix string) Option {
	return func(c *config) {
		for _, r := range prefix {
			if r == '{' || r == '}' {
				c.err = errs.Invalidf("key prefix %q contains a brace", prefix)
				return
			}
		}
		c.Prefix = prefix
	}
}

// WithWatchdogTimeout sets the lease of holds taken without WithLease.
// Default 30s. The watchdog renews such holds every d/3, and a hold whose
// renewals have failed for d is reported lost. d must be between MinLease
// and MaxLease; leases are kept in whole milliseconds, rounded up.
// WithRenewedLease and WithRenewedPermitLease set it for one handle.
func WithWatchdogTimeout(d time.Duration) Option {
	return func(c *config) {
		if err := checkLease("watchdog timeout", d); err != nil {
			c.err = err
			return
		}
		c.Watchdog = d
	}
}

// outOfBounds says why d is not a lease dlock accepts, or "" (a name for
// lease.OutOfBounds where a parameter called lease hides the package).
var outOfBounds = lease.OutOfBounds

// checkLease refuses a lease or timeout outside [MinLease, MaxLease], with
// an error that names the bound.
func checkLease(what string, d time.Duration) error {
	if why := lease.OutOfBounds(what, d); why != "" {
		return errs.Invalidf("%s", why)
	}
	return nil
}

// WithLogger sets where dlock logs lost holds, renewal failures and pub/sub
// reconnects. Default: nothing is logged.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) {
		if l != nil {
			c.Logger = l
		}
	}
}

// WithTracerProvider sets where dlock's spans go. Default: the OpenTelemetry
// global TracerProvider, so a service that configured OpenTelemetry gets
// them with no dlock-specific setup.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tracerProvider = tp }
}

// WithMeterProvider sets where dlock's metrics go. Default: the
// OpenTelemetry global MeterProvider.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.meterProvider = mp }
}

// WithMetricLockNames adds the lock's name (attribute dlock.name) to every
// metric point. Off by default: one time series per lock name can be many.
// Spans always carry the name.
func WithMetricLockNames() Option {
	return func(c *config) { c.nameAttr = true }
}

// WithSyncReplicas makes every grant wait until at least replicas replicas
// of the Redis master have acknowledged it, for up to timeout, with Redis's
// WAIT. It is meant for one master with replicas, under Sentinel or not.
//
// A grant is every call that takes or adds to a hold: Lock, TryLock, RLock,
// TryRLock, Acquire, TryAcquire and Drain, re-entries, and a lock handed
// over by a release. When such a call returns holding, the grant (holder,
// lease and fencing token) had reached that many replicas. When they did not
// acknowledge in time, the grant is given back before the call returns, and
// the call fails with an error matching ErrNotReplicated and ErrNotObtained;
// a blocking call does not try again.
//
// What it does not promise. WAIT does not make Redis strongly consistent: a
// failover promotes the replica Sentinel judges best, a best effort. With
// more replicas than replicas, Sentinel may promote one that had not
// acknowledged, and the lock is lost as without the option; with
// WithSyncReplicas(n, ...) and n replicas in all, every replica it could
// promote had the grant, unless a replica lost its data since (a restart
// without persistence) or joined later. An acknowledgement means the replica
// applied the grant in memory, not that it wrote it to disk. Only grants wait:
// renewals, releases and waiters' places replicate as they always do, so a
// failover during a renewal outage can bring back an older expiry (the hold
// then ends up to a third of its watchdog lease early on the new master),
// and a release that did not reach the new master leaves the lock held until
// its lease runs out.
//
// Cost. Each try sends WAIT right after its script on the same connection,
// in one pipeline: no extra round trip, but the reply waits for the
// replicas, one master-to-replica round trip when they keep up and up to
// timeout when they do not, refused tries included. Tries do not share
// pipelines with other calls (see internal/coalesce). A Mutex waiter handed
// the lock by a release claims it with one round trip instead of none: the
// hand-over was written by the releaser's connection, which its WAIT cannot
// cover, but replication keeps order, so a WAIT after the claim covers the
// hand-over too. Without the option, nothing of this is sent.
//
// On Redis Cluster, WAIT counts the replicas of one master: each try and its
// WAIT go to the master of the lock's hash slot, and a try that meets a slot
// being moved fails with the redirection error rather than following it.
//
// replicas must be at least 1 and timeout positive; timeout is kept in whole
// milliseconds, rounded up. Since the reply to WAIT must arrive before the
// go-redis client's read deadline, timeout may be at most half its
// ReadTimeout (5s by default), and it should be well under a third of the
// shortest lease, or slow acknowledgements make grants too late to keep.
// Otherwise every call returns an error wrapping ErrInvalid.
func WithSyncReplicas(replicas int, timeout time.Duration) Option {
	return func(c *config) {
		if replicas < 1 || timeout <= 0 {
			c.err = errs.Invalidf("sync replicas: %d replicas within %v: need at least 1 replica and a positive timeout", replicas, timeout)
			return
		}
		c.Sync = engine.SyncReplicas{Replicas: replicas, Timeout: timeout}
	}
}

// LockOption configures one lock handle.
type LockOption func(*lockConfig)

type lockConfig struct {
	lease       time.Duration      // 0: watchdog
	renewed     time.Duration      // WithRenewedLease; 0: the Client's watchdog timeout
	handleOwner bool               // the handle owns holds taken without an owner in ctx
	cohort      engine.CohortBound // WithCohort, or the defaults; zero: off
	cohortSet   bool               // WithCohort or WithoutCohort given
	err         error
}

// WithHandleOwner makes a ReentrantMutex or RWMutex handle the owner of the
// holds taken through it with no owner in the context, as one sync.Mutex
// variable would be if it were reentrant: every goroutine using the handle
// without an owner then shares its holds, re-entering instead of excluding
// each other. Use it for a handle that one goroutine, or one logical owner,
// uses; do not share such a handle between goroutines that must exclude
// each other. Without it, those handles require an owner in the context (see
// WithOwner), and a call with none fails with ErrInvalid. Other primitives
// ignore it.
func WithHandleOwner() LockOption {
	return func(c *lockConfig) { c.handleOwner = true }
}

// WithLease gives every hold taken through the handle a fixed lease of d: it
// is never renewed, and expires d after it was taken unless released first.
// Its Lost channel closes when d has passed. d must be between MinLease and
// MaxLease; it is kept in whole milliseconds, rounded up. Without WithLease
// the watchdog renews the hold until it is released. It cannot be combined
// with WithRenewedLease.
func WithLease(d time.Duration) LockOption {
	return func(c *lockConfig) {
		if err := checkLease("lease", d); err != nil {
			c.err = err
			return
		}
		c.lease = d
	}
}

// WithRenewedLease gives every hold taken through the handle a lease of d
// that the watchdog renews while the hold lasts, every d/3 (in the same
// batched renewals as the Client's other holds), in place of the Client's
// watchdog timeout (WithWatchdogTimeout). It is the recovery time of one
// primitive: when a holder dies, its lock is free again, an Election elects
// its next leader, at most about d after the holder's last renewal. A waiter
// queued through the handle keeps its place with a mark of at most d/3, so a
// waiter that dies holds the queue up no longer than that.
//
// How to choose d: the shorter it is, the sooner a dead holder's lock comes
// back, and the more renewal traffic its holds make (3/d renewals a second
// each, 100 to a script call), and the less a holder may stall (a long GC,
// a slow network) before it is told its hold is lost: renewals must get
// through within about a third of d. A few seconds suits an Election that
// must fail over quickly on a healthy network; the Client's default, 30s,
// suits locks held across slow work. d must be between MinLease and
// MaxLease. It cannot be combined with WithLease.
func WithRenewedLease(d time.Duration) LockOption {
	return func(c *lockConfig) {
		if err := checkLease("renewed lease", d); err != nil {
			c.err = err
			return
		}
		c.renewed = d
	}
}

// Default bounds of lock cohorting (WithCohort), chosen with the contention bench (bench/,
// -only contention -cont-cohort 2,4,8: 16 goroutines over 4 Clients, 1ms
// hold). 4 local handoffs per Redis grant (5 holds a cohort) took the lock
// from about 0.8 to above 0.9 of the time held, with the wait p99 about the
// plain Mutex's; 8 gained a little more throughput but put the wait p99
// above 2 x workers x hold, since another Client's waiter then waits for up
// to 9 holds of each cohort ahead of it. 10ms ends a cohort of long holds
// early. Cohorting is on by default because it costs nothing measurable
// uncontended (a grant's reservation rides in the same HSET; W1 0.90 of
// the PING floor with it, as without) and is what takes a contended Mutex
// to 0.9 of the time held.
const (
	DefaultCohortHandoffs = 4
	DefaultCohortTime     = 10 * time.Millisecond
)

// WithCohort sets the bounds of lock cohorting, which a Mutex (and a
// ReentrantMutex, and an RWMutex's writers) does by default
// with DefaultCohortHandoffs and DefaultCohortTime (WithoutCohort turns it
// off). A cohorting Mutex hands its hold on to the next goroutine of its
// Client waiting for the same name, on the same handle or on another
// cohorting Mutex handle of the Client, with no round trip to Redis, at
// most maxHandoffs times in a row and while less than maxTime has passed
// since Redis granted the hold (lock cohorting); then the lock goes back to
// the queue in Redis, so that waiters on other Clients, and handles
// WithoutCohort, are served in their turn. Past maxTime, a hold still goes
// to a goroutine of its Client (within maxHandoffs) when nobody else waits:
// Redis granted it with nobody queued, the Client has been subscribed to
// the lock's channel since before that grant, and no waiter that this
// Client would not serve (for an RWMutex, any reader) has queued since
// (each such waiter's try announces itself on the channel; one still on
// its way there is missed).
// The bounds are those of the handle that hands the hold on. A Lock called
// while the handle holds the lock, or on another cohorting handle while a
// cohort of the Client runs and others of it wait, waits for such a handoff
// without a round trip; when the cohort ends first, it queues in Redis,
// behind the waiters already there. Otherwise a Lock on another handle
// first queues in Redis, then is served locally in its turn.
// So a waiter on another Client is served after at most maxHandoffs local
// handoffs of each Redis grant ahead of it in the queue: FIFO across
// Clients holds within that bound. Under contention this
// saves most round trips and the Redis handoffs' latency. maxHandoffs or
// maxTime <= 0 selects DefaultCohortHandoffs or DefaultCohortTime.
//
// Every guarantee holds per hold: exclusion; a fencing token strictly greater
// than every earlier one (a Redis grant reserves maxHandoffs tokens after its
// own, and local handoffs use them, so the next grant follows them); a Lost
// channel and hold context of its own; and the lease of the Redis grant,
// whose deadline a local handoff inherits and never extends (a hold whose
// lease has less than a third left is not handed on locally). While a cohort
// runs, Status names the hold that Redis granted (its holder ID and token),
// and a HoldRef from HandOver carries that ID with the local hold's token. A
// hold that was extended (Extend) or lost is released to Redis, not handed
// on. A Mutex, a ReentrantMutex and an RWMutex's writers use WithCohort
// (a ReentrantMutex hands an owner's last Unlock to another owner of the
// Client, with its own count; re-entry never waits for a cohort; an
// RWMutex hands a write hold on only when neither owner reads, and
// readers queued meanwhile get the lock when the cohort releases it, before
// the next writer), not with WithLease, and not a Redlock Mutex; other
// primitives ignore it.
//
// A waiter served locally may leave its place in the queue in Redis behind
// for a moment; the Unlock that ends the cohort removes it. If the cohort
// ends otherwise (Close, a lost lease, ForceUnlock, a HoldRef released
// elsewhere), such a place runs out with its waiting mark, within a third of
// the watchdog timeout, and the lock may wait for it that long.
func WithCohort(maxHandoffs int, maxTime time.Duration) LockOption {
	return func(c *lockConfig) {
		if maxHandoffs <= 0 {
			maxHandoffs = DefaultCohortHandoffs
		}
		if maxTime <= 0 {
			maxTime = DefaultCohortTime
		}
		c.cohort, c.cohortSet = engine.CohortBound{Max: maxHandoffs, MaxTime: maxTime}, true
	}
}

// WithoutCohort turns off lock cohorting (see WithCohort), which a Mutex
// does by default: every Lock on the handle then goes through the queue in
// Redis, and no hold is handed to it locally, so that its holds are granted
// in strict arrival order across handles and Clients, and its queue place
// is always its own. It costs throughput under contention (0.81-0.85 of the
// time held instead of about 0.9 in the bench's 4 Clients x 4 goroutines
// run) and nothing uncontended.
func WithoutCohort() LockOption {
	return func(c *lockConfig) { c.cohort, c.cohortSet = engine.CohortBound{}, true }
}

func buildLockConfig(opts []LockOption) lockConfig {
	var lc lockConfig
	for _, o := range opts {
		if o != nil {
			o(&lc)
		}
	}
	if !lc.cohortSet {
		lc.cohort = engine.CohortBound{Max: DefaultCohortHandoffs, MaxTime: DefaultCohortTime}
	}
	if lc.err == nil && lc.lease > 0 && lc.renewed > 0 {
		lc.err = errs.Invalidf("WithLease and WithRenewedLease together: a hold's lease is fixed or renewed")
	}
	return lc
}

// SemaphoreOption configures a Semaphore handle.
type SemaphoreOption interface{ applySemaphore(*semConfig) }

// LatchOption configures a CountDownLatch handle.
type LatchOption interface{ applyLatch(*latchConfig) }

type semConfig struct {
	lease   time.Duration      // fixed permit lease; 0: the watchdog renews permits
	renewed time.Duration      // WithRenewedPermitLease; 0: the Client's watchdog timeout
	idle    time.Duration      // idle expiry of the keys; 0: they persist
	cohort  engine.CohortBound // WithPermitCohort, or the defaults; zero: off
	noCo    bool               // WithoutPermitCohort
	err     error
}

// latchConfig is what a latch's options set: its idle expiry.
type latchConfig = semConfig

// buildSemConfig applies the options of a Semaphore or CountDownLatch,
// stopping at the first error.
func buildSemConfig[O any](opts []O, apply func(O, *semConfig)) semConfig {
	var sc semConfig
	for _, o := range opts {
		if any(o) != nil && sc.err == nil {
			apply(o, &sc)
		}
	}
	if sc.cohort.Max == 0 && !sc.noCo {
		sc.cohort = engine.CohortBound{Max: DefaultCohortHandoffs, MaxTime: DefaultCohortTime}
	}
	return sc
}

type semOption func(*semConfig)

func (o semOption) applySemaphore(c *semConfig) { o(c) }

// WithPermitLease gives every Permit taken through the handle a fixed lease
// of d, never renewed. d must be between MinLease and MaxLease. Without it
// the watchdog renews permits until they are released.
func WithPermitLease(d time.Duration) SemaphoreOption {
	return semOption(func(c *semConfig) {
		if err := checkLease("permit lease", d); err != nil {
			c.err = err
			return
		}
		if c.renewed > 0 {
			c.err = errs.Invalidf("WithPermitLease and WithRenewedPermitLease together: a permit's lease is fixed or renewed")
			return
		}
		c.lease = d
	})
}

// WithRenewedPermitLease gives every Permit taken through the handle a lease
// of d that the watchdog renews while the permit is held, in place of the
// Client's watchdog timeout: a crashed holder's permits come back about d
// after its last renewal. See WithRenewedLease for how to choose d. d must
// be between MinLease and MaxLease. It cannot be combined with
// WithPermitLease.
func WithRenewedPermitLease(d time.Duration) SemaphoreOption {
	return semOption(func(c *semConfig) {
		if err := checkLease("renewed permit lease", d); err != nil {
			c.err = err
			return
		}
		if c.lease > 0 {
			c.err = errs.Invalidf("WithPermitLease and WithRenewedPermitLease together: a permit's lease is fixed or renewed")
			return
		}
		c.renewed = d
	})
}

// WithPermitCohort sets the bounds of a Semaphore's permit cohorting, which
// it does by default with DefaultCohortHandoffs and DefaultCohortTime
// (WithoutPermitCohort turns it off). A Permit that Release gives back
// while another Acquire of its Client for the same number of permits waits
// on the semaphore (through any handle) passes to that Acquire, with no
// round trip to Redis before it returns, at most maxHandoffs times in a row
// and while less than maxTime has passed since Redis granted the permits;
// then they go back to Redis, and to the requests queued there in arrival
// order. An Acquire called while such a cohort of its Client runs, and
// other Acquires of the Client wait too, waits for its handoff without a
// round trip; if the cohort ends first, the
// release that ends it queues the Acquire in Redis (behind the requests
// queued there, ahead of the releasing goroutine's next one), and after
// maxTime at the latest it queues on its own. A request on another Client
// is therefore served after at most maxHandoffs local handoffs of each
// Redis grant ahead of it: arrival order across Clients holds within that
// bound. Under contention this keeps the permits in use while a Redis
// handoff would be under way, at some cost in the spread of waits: in the
// bench (2 permits, 1 ms holds) 1244-1261 acquisitions/s at 4 Clients x 4
// goroutines against 1098-1106 without, and 1257-1288 against 964-1024 at
// 16 x 4, with a wait p99 of 23-30 ms against 16 ms, and 127-134 ms against
// 68-70 ms. maxHandoffs or maxTime <= 0 selects DefaultCohortHandoffs or
// DefaultCohortTime.
//
// Every guarantee holds per Permit: permits never above the total (a
// handoff the total no longer allows is refused: the Permit handed on is
// lost at once), a Lost
// channel and hold context of its own, and the lease of the Redis grant,
// whose deadline a handed Permit inherits and never extends (permits with
// less than a third of their lease left, or with a fixed lease
// (WithPermitLease), or extended, are not handed on). Its fencing token,
// too, is above every token issued before it for the semaphore: a handed
// Permit's token is issued by a script sent as it is handed on, after it
// began (not reserved at the Redis grant, as a Mutex cohort's are, since
// other Clients take permits meanwhile), so Permit.Token, and the Permit's
// Release, wait for that reply, which the holder has usually had for long.
// A Permit goes only to an Acquire on a handle whose lease is renewed and
// as long (an Acquire on a handle WithPermitLease, or with another
// WithRenewedPermitLease, is served from Redis). A Client WithSyncReplicas
// hands no Permit on: a handed Permit's token would be issued without a
// WAIT.
func WithPermitCohort(maxHandoffs int, maxTime time.Duration) SemaphoreOption {
	return semOption(func(c *semConfig) {
		if maxHandoffs <= 0 {
			maxHandoffs = DefaultCohortHandoffs
		}
		if maxTime <= 0 {
			maxTime = DefaultCohortTime
		}
		c.cohort, c.noCo = engine.CohortBound{Max: maxHandoffs, MaxTime: maxTime}, false
	})
}

// WithoutPermitCohort turns off permit cohorting (see WithPermitCohort):
// every Permit taken through the handle goes back to Redis on Release, and
// every Acquire is served from the queue in Redis in strict arrival order
// across Clients.
func WithoutPermitCohort() SemaphoreOption {
	return semOption(func(c *semConfig) { c.cohort, c.noCo = engine.CohortBound{}, true })
}

// IdleExpiry is the option WithIdleExpiry returns; it configures a
// Semaphore or a CountDownLatch.
type IdleExpiry time.Duration

// WithIdleExpiry makes a Semaphore's or a CountDownLatch's keys expire when
// nobody has used it for d: every call that touches it in Redis, and every
// renewal of a permit or of a waiter's place, keeps its keys at least d
// from expiry. A semaphore records d when its total is set (TrySetPermits,
// SetPermits), a latch when its count is set (TrySetCount). d must be
// between MinLease and MaxLease. Without it, the keys persist until deleted.
func WithIdleExpiry(d time.Duration) IdleExpiry { return IdleExpiry(d) }

func (d IdleExpiry) applySemaphore(c *semConfig) { c.idle, c.err = d.check(c.err) }
func (d IdleExpiry) applyLatch(c *latchConfig)   { c.idle, c.err = d.check(c.err) }

func (d IdleExpiry) check(err error) (time.Duration, error) {
	if err == nil {
		err = checkLease("idle expiry", time.Duration(d))
	}
	return time.Duration(d), err
}
