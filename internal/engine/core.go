package engine

import (
	"context"
	"log/slog"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/coalesce"
	"github.com/dlock-go/dlock/internal/lease"
	"github.com/dlock-go/dlock/internal/pubsub"
	"github.com/dlock-go/dlock/internal/telemetry"
	"github.com/dlock-go/dlock/internal/wait"
	"github.com/dlock-go/dlock/internal/wire"
)

const (
	// subscriptionLinger keeps a lock's channel subscribed after its last
	// waiter leaves, so a hot lock does not re-subscribe for every wait.
	subscriptionLinger = 5 * time.Second
	// PipelinesInFlight is how many pipelines of coalesced calls a Core
	// (or a Redlock master) keeps in flight before further calls wait to
	// share the next one. Measured on 2 cores with 32 goroutines: 4 did best
	// (2 and 8 close).
	PipelinesInFlight = 4
)

// Config is what the machinery takes from a Client's options.
type Config struct {
	Prefix   string        // starts every key
	Watchdog time.Duration // the lease of holds the watchdog renews
	Logger   *slog.Logger
	Sync     SyncReplicas // WithSyncReplicas; zero when off
}

// Core is one Client's machinery: the connection to Redis, the watchdog
// that renews its holds, the pub/sub hub and registry its blocked callers
// wait on, its counted holds, and its telemetry. A Redlock has a Core of
// its own with no Redis of its own (see NewDetached).
type Core struct {
	RDB   redis.UniversalClient // nil for a Redlock's Core
	Cfg   Config
	ID    string // random; prefixes every owner ID and tags release messages
	Err   error  // bad input found when the Client was made: every call returns it
	Waits *wait.Registry
	Loop  *wait.Loop // how blocking calls wait
	WD    *lease.Watchdog
	Tel   *telemetry.Telemetry
	Hooks Hooks // for tests; zero outside them

	cluster  bool                // scripts must then be batched per hash slot
	co       *coalesce.Coalescer // shares round trips between concurrent calls; nil on a cluster
	hub      *pubsub.Hub
	renewals *lease.Renewals // how the watchdog's renewals reach Redis
	outage   *lease.Outage

	holds holdTable // counted holds and owner gates (holds.go)

	// Background work of the Core (background): Close cancels bgCtx and
	// waits for it.
	bgMu      sync.Mutex
	bg        sync.WaitGroup
	bgCtx     context.Context
	bgCancel  context.CancelFunc
	bgStopped bool // guarded by bgMu

	noted       sync.Map      // keys FirstTime has seen
	forced      sync.Map      // lock key and grant ID (HoldKey) -> forcedMark (cohort.go)
	forcedMarks atomic.Int32  // how many marks forced keeps (markForced)
	maxRenewed  atomic.Int64  // the longest WithRenewedLease of the Core's handles, ns
	waiterSeq   atomic.Uint64 // numbers waiters that have no ID of their own
	closed      atomic.Bool
	closeOnce   sync.Once
}

// Hooks let internal tests stop a Core at the points where a race they
// reproduce happens. Each is called, when set, on the goroutine that
// reaches the point.
type Hooks struct {
	BeforeCohortRelease func() // Mutex release: a cohort's local waiters were queued for the releasing script
	BeforeLocalWait     func() // Mutex Lock: it found a cohort running, and is about to wait for a local handoff
	BeforePassLocal     func() // Mutex Unlock: the hold is out of its slot, about to be handed on locally
	AfterForcedNotice   func() // a ForceUnlock's notice was acted on (forceNotice)
	// ReentrantMutex Lock: granted l, about to record it for its owner.
	BeforeRecordGrant func(l *lease.Hold)
}

// New returns the Core of a Client on rdb. err, when not nil, is bad input
// the Client found: the Core then starts nothing, and every call fails
// with it.
func New(rdb redis.UniversalClient, cfg Config, tel *telemetry.Telemetry, id string, err error) *Core {
	c := &Core{RDB: rdb, Cfg: cfg, ID: id, Err: err, Tel: tel}
	c.holds.init()
	if c.Err == nil {
		c.Err = checkSyncReplicas(rdb, cfg.Sync)
	}
	if c.Err != nil {
		c.closed.Store(true)
		return c
	}
	_, c.cluster = rdb.(*redis.ClusterClient)
	if !c.cluster {
		// Not on a cluster: go-redis retries a whole pipeline when its first
		// command fails with TRYAGAIN (a resharding slot), which would run
		// the other commands in it twice.
		c.co = coalesce.New(rdb, PipelinesInFlight)
	}
	c.Waits = wait.NewRegistry()
	c.hub = pubsub.New(rdb, hubHandler{c}, pubsub.Options{Linger: subscriptionLinger, Logger: cfg.Logger})
	c.renewals = lease.NewRenewals(rdb)
	c.outage = &lease.Outage{Log: cfg.Logger}
	c.WD = lease.NewWatchdog(cfg.Watchdog, c.renewals.Send, c.cluster, c.Tel, c.outage)
	c.WD.CohortLost = c.cohortLost
	c.bgCtx, c.bgCancel = context.WithCancel(context.Background())
	c.Loop = &wait.Loop{Reg: c.Waits, Hub: c.hub, Tel: c.Tel, Timeout: cfg.Watchdog}
	return c
}

// IsNilClient reports whether rdb is nil, or a nil pointer in an
// interface.
func IsNilClient(rdb redis.UniversalClient) bool {
	if rdb == nil {
		return true
	}
	v := reflect.ValueOf(rdb)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// NewDetached returns a Core with no Redis of its own, for an engine that
// talks to its servers itself (a Redlock): send carries the watchdog's
// renewals, and the engine's own pub/sub wakes the Core's waiters.
func NewDetached(cfg Config, tel *telemetry.Telemetry, id string, err error, send lease.Sender) *Core {
	c := &Core{Cfg: cfg, ID: id, Err: err, Tel: tel}
	c.holds.init()
	if c.Err != nil {
		c.closed.Store(true)
		return c
	}
	c.Waits = wait.NewRegistry()
	c.Loop = &wait.Loop{Reg: c.Waits, Tel: c.Tel, Timeout: cfg.Watchdog}
	c.outage = &lease.Outage{Log: cfg.Logger}
	c.WD = lease.NewWatchdog(cfg.Watchdog, send, false, c.Tel, c.outage)
	return c
}

// Closed reports whether the Core was closed (or never started).
func (c *Core) Closed() bool { return c.closed.Load() }

// Close stops the watchdog and the pub/sub connection and waits for their
// goroutines to exit; blocked calls return ErrClosed. It is idempotent. A
// Core that never started (bad input) has nothing to close.
func (c *Core) Close() error {
	if c.Err != nil {
		return nil
	}
	var err error
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		c.Waits.Close()
		c.WD.Close()
		c.stopBackground()
		if c.renewals != nil {
			c.renewals.Close()
		}
		if c.hub != nil {
			err = c.hub.Close()
		}
	})
	return err
}

// noteRenewed records d if it is the longest lease renewed yet for a
// handle of the Core (WithRenewedLease).
func (c *Core) noteRenewed(d time.Duration) {
	for cur := c.maxRenewed.Load(); int64(d) > cur; cur = c.maxRenewed.Load() {
		if c.maxRenewed.CompareAndSwap(cur, int64(d)) {
			return
		}
	}
}

// Background runs f on a goroutine of the Core's, which Close waits for,
// with a context that Close cancels. It reports false, running nothing,
// once the Core has closed.
func (c *Core) Background(f func(ctx context.Context)) bool {
	c.bgMu.Lock()
	defer c.bgMu.Unlock()
	if c.bgStopped || c.bgCtx == nil {
		return false
	}
	c.bg.Go(func() { f(c.bgCtx) })
	return true
}

func (c *Core) stopBackground() {
	c.bgMu.Lock()
	c.bgStopped = true
	c.bgMu.Unlock()
	if c.bgCancel != nil {
		c.bgCancel()
	}
	c.bg.Wait()
}

// Hub is the Core's pub/sub hub (nil for a detached Core).
func (c *Core) Hub() *pubsub.Hub { return c.hub }

// Renewals is how the Core's renewals reach Redis (nil for a detached
// Core).
func (c *Core) Renewals() *lease.Renewals { return c.renewals }

// hubHandler turns pub/sub events into wake-ups of local waiters.
type hubHandler struct{ c *Core }

// Message wakes waiters after a release elsewhere. A release by this Core
// already woke its local waiter directly, so its echo is ignored.
func (h hubHandler) Message(channel, payload string) {
	m := wire.DecodeRelease(payload)
	if m.Wake.Kind == wire.KindQueued {
		// Someone waits whom this Client's cohort would not serve (its own
		// non-cohorting waiters included): a cohort holding the lock keeps
		// its time bound (cohort.go).
		h.c.hub.Note(channel)
		return
	}
	if m.Wake.Kind == wire.KindReleased {
		// A ForceUnlock (this Client's too) took a hold away (excl_force);
		// it wakes nobody: the grant that follows, if any, does.
		if len(m.Wake.IDs) == 1 && m.Wake.Fence > 0 {
			h.c.forceNotice(channel, m.Wake.IDs[0], m.Wake.Fence)
		}
		return
	}
	if m.From == h.c.ID {
		return // the sender woke its own waiters
	}
	h.c.Waits.Wake(channel, m.Wake, wait.WakeRelease)
}

// forceNotice reports lost the hold of this Core that a ForceUnlock
// took away, the grant id with token, as far as the Core can find it by the
// channel it heard of it on: a counted hold of that owner with that token
// (an owner's ID outlives its holds), a ReentrantMutex owner's hold of that
// grant, or a Mutex cohort's hold of that
// grant. For the cohort it marks the grant as forced (markForced) before it
// looks at the hold the registry records for the lock's cohort, so that a
// local handoff under way, or one to come, finds the mark instead
// (passLocal). The holder learns at once rather than at its next renewal.
// Other holds are left to their renewals, as are the holds of a Client not
// subscribed to the lock's channel (one with no goroutine waiting for it).
func (c *Core) forceNotice(channel, id string, token uint64) {
	key, ok := strings.CutSuffix(channel, wire.ChannelSuffix)
	if !ok {
		return
	}
	if l := c.heldLease(HoldKey(key, id)); l != nil && l.Token == token {
		c.WD.Lose(&l.Lease, errForced)
	}
	c.markForced(key, id, token)
	for _, l := range c.grantsOf(key, id) { // a ReentrantMutex's (reentrant.go)
		if c.isForced(l) {
			c.WD.Lose(&l.Lease, errForced)
		}
	}
	if s, _ := c.Waits.CohortAt(channel, key).(*Slot); s != nil {
		if l := s.Get(); c.isForced(l) {
			c.WD.Lose(&l.Lease, errForced)
		}
	}
	if hook := c.Hooks.AfterForcedNotice; hook != nil {
		hook()
	}
}

// Subscribed wakes every waiter on channel: any release before the
// confirmation may have been missed, so each must look again.
func (h hubHandler) Subscribed(channel string) {
	h.c.Waits.Wake(channel, wire.WakeAll, wait.WakeSubscribed)
}

// Script runs one of dlock's scripts. A call whose ctx cannot be cancelled
// shares a pipeline with other calls of this Core in flight at the same
// moment (see internal/coalesce); one with a cancellable ctx goes alone, so
// that its ctx still applies. With WithSyncReplicas, a try's script (its
// ctx made by Acquisition.TryCtx) goes with a WAIT behind it instead.
func (c *Core) Script(ctx context.Context, s *redis.Script, keys []string, args ...any) *redis.Cmd {
	return c.ScriptBoxed(ctx, s, keys, nil, args...)
}

// ScriptBoxed is Script with the keys also given boxed (see
// coalesce.Coalescer.RunBoxed; nil: none), for the calls of a hot path.
func (c *Core) ScriptBoxed(ctx context.Context, s *redis.Script, keys []string, boxed []any, args ...any) *redis.Cmd {
	if c.Cfg.Sync.Replicas > 0 {
		if ack, _ := ctx.Value(ackKey{}).(*replicaAck); ack != nil {
			return c.scriptAcked(ctx, ack, s, keys, args)
		}
	}
	var cmd *redis.Cmd
	if c.co == nil || ctx.Done() != nil {
		cmd = s.Run(ctx, c.RDB, keys, args...)
	} else {
		cmd = c.co.RunBoxed(ctx, s, keys, boxed, args...)
	}
	c.outage.Saw(cmd.Err())
	return cmd
}

// WaiterID returns an ID for a waiter that has none of its own, unique in
// this Core (no token or permit ID can look like it).
func (c *Core) WaiterID() string {
	return "#" + strconv.FormatUint(c.waiterSeq.Add(1), 10)
}

// NewToken returns a fresh ID for a Mutex acquisition (wire.HoldID): the
// Core's ID and a dot, which tell whoever waits who holds the lock, and 128
// random bits, which make the ID unique.
func (c *Core) NewToken() string { return wire.HoldID(c.ID) }

// watchdogLease is the lease of holds the watchdog renews, in whole
// milliseconds.
func (c *Core) watchdogLease() time.Duration {
	return time.Duration(wire.Millis(c.Cfg.Watchdog)) * time.Millisecond
}

// MarkLease is the lease of a waiting caller's place in a queue: a third of
// the watchdog timeout, renewed three times as often as holds. A waiter that
// dies then holds its queue up for at most that long: the lock may be handed
// to it first, for what is left of its mark.
func (c *Core) MarkLease() time.Duration { return lease.MarkLease(c.Cfg.Watchdog) }

// FirstTime reports whether this is the first time the Core is asked about
// key: for what is logged once per Client (a semaphore waited on with its
// total unset).
func (c *Core) FirstTime(key string) bool {
	_, seen := c.noted.LoadOrStore(key, struct{}{})
	return !seen
}
