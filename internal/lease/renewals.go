package lease

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/scripts"
)

// WarmConns is how many connections a Client sets up for renewals when it
// first talks to Redis (see renewals).
const WarmConns = 4

// Renewals is how the watchdog's renewal calls reach Redis: pipelines, which
// go-redis runs on a pool of their own (Options.PipelinePoolSize), apart from
// the connections the caller's own commands use.
//
// When a Client first acquires, it sets up WarmConns connections in that
// pool, by that many one-PING pipelines at once, alongside its first try;
// they then wait there, warm. go-redis needs three round trips to set up a
// connection (HELLO, CLIENT MAINT_NOTIFICATIONS, CLIENT SETINFO); a renewal
// that had to dial one would come three round trips late, which on a slow
// network is longer than a new hold has left before its first renewal must
// be back. The first try dials too, so its grant and the warm-ups come back
// at about the same time: a renewal sent while warm-ups are still in flight
// waits for them rather than dial a connection of its own (see awaitWarm).
// (Connections of its own, from go-redis's Conn, would be surer, but their
// set-up races with the pool's on the client's shared options, and
// go-redis's race detector builds flag it.)
type Renewals struct {
	rdb    redis.UniversalClient
	cached atomic.Bool // the server has cached the renewal script

	// On a cluster (see renew_cluster.go):
	perSlot    atomic.Bool // the servers reject script flags: calls per slot (still sent per node)
	nodeMu     sync.Mutex
	nodeCached map[string]bool // by node address and script SHA1: the node has the script cached
	nodeScript *redis.Script   // nil: scripts.RenewNode (tests set another before the first renewal)

	mu      sync.Mutex // orders warm-ups before close
	closed  bool
	started atomic.Bool // the warm-ups were started
	warm    sync.WaitGroup
	warming atomic.Pointer[chan struct{}] // closed when the warm-ups are over; nil before prepare
}

// NewRenewals returns how the renewals of a watchdog reach rdb: give its
// Send to NewWatchdog.
func NewRenewals(rdb redis.UniversalClient) *Renewals { return &Renewals{rdb: rdb} }

// SetPerSlot forces a cluster's renewals per hash slot (on), as on servers
// without script flags, or lets them go per node again; PerSlot reports it.
// For tests.
func (r *Renewals) SetPerSlot(on bool) { r.perSlot.Store(on) }

func (r *Renewals) PerSlot() bool { return r.perSlot.Load() }

// SetNodeScript makes a cluster's renewals per node run src instead of
// internal/scripts/renew_node.lua. Call it before the first hold. For
// tests.
func (r *Renewals) SetNodeScript(src string) { r.nodeScript = redis.NewScript(src) }

// Prepare sets up warm connections in the pipeline pool, in the
// background, once.
func (r *Renewals) Prepare() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || !r.started.CompareAndSwap(false, true) {
		return
	}
	over := make(chan struct{})
	var pings sync.WaitGroup
	for range WarmConns {
		pings.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			// A failure only leaves the pool colder.
			_, _ = r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				p.Ping(ctx)
				return nil
			})
		})
	}
	r.warm.Go(func() {
		pings.Wait()
		close(over)
	})
	r.warming.Store(&over)
}

// awaitWarm waits until the warm-ups in flight, if any, are over, for at
// most half of what ctx (the renewal's lease) has left: a renewal then takes
// a warm connection instead of dialing one. Warm-ups that hang (the server
// unreachable when they began) are not waited for past that; the renewal
// then goes out on whatever the pool gives it.
func (r *Renewals) awaitWarm(ctx context.Context) {
	over := r.warming.Load()
	if over == nil {
		return
	}
	select {
	case <-*over:
		return
	default:
	}
	wait := time.Second
	if dl, ok := ctx.Deadline(); ok {
		wait = time.Until(dl) / 2
	}
	if wait <= 0 {
		return
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-*over:
	case <-t.C:
	case <-ctx.Done():
	}
}

// Send runs a chunk's renewal calls: on a cluster, per node (merged when
// the servers allow it: see sendPerNode); elsewhere, in one pipeline.
func (r *Renewals) Send(ctx context.Context, calls []RenewCall, settle func(RenewResult)) {
	if cc, ok := r.rdb.(*redis.ClusterClient); ok {
		r.sendPerNode(ctx, cc, calls, settle)
		return
	}
	settle(r.pipeline(ctx, calls))
}

// pipeline runs renewal calls in one pipeline, each with its keys in KEYS
// (so on a cluster, each call's keys in one slot, routed by go-redis).
// Until the server is known to have the renewal script cached, the first
// call carries its source (EVAL), which caches it for the calls behind it;
// so a Client's first renewal costs one round trip even on a slow network.
// Calls that still meet an empty script cache (after SCRIPT FLUSH, a
// restart, a failover, or on another cluster node) are sent again with the
// source: one more round trip, never one per call. The send time is the
// first pipeline's, taken after any wait for warm-ups.
func (r *Renewals) pipeline(ctx context.Context, calls []RenewCall) RenewResult {
	r.awaitWarm(ctx)
	cmds := make([]*redis.Cmd, len(calls))
	withSource := !r.cached.Load()
	sent := time.Now()
	_, _ = r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, b := range calls {
			if i == 0 && withSource {
				cmds[i] = scripts.Renew.Eval(ctx, p, b.Keys, b.Args...)
			} else {
				cmds[i] = scripts.Renew.EvalSha(ctx, p, b.Keys, b.Args...)
			}
		}
		return nil
	})
	var again []int
	for i, cmd := range cmds {
		if errs.IsNoScript(cmd.Err()) {
			again = append(again, i)
		}
	}
	if len(again) == 0 {
		r.cached.Store(cmds[0].Err() == nil)
	} else {
		r.cached.Store(false)
		_, _ = r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, i := range again {
				cmds[i] = scripts.Renew.Eval(ctx, p, calls[i].Keys, calls[i].Args...)
			}
			return nil
		})
	}
	out := RenewResult{Calls: calls, Replies: make([]RenewReply, len(calls)), Sent: sent, Scripts: make([]int, len(calls))}
	for i, cmd := range cmds {
		out.Replies[i].Res, out.Replies[i].Err = cmd.Int64Slice()
		out.Scripts[i] = len(calls[i].Leases)
	}
	return out
}

// warmDelay is how often a Client's first acquisition looks whether its
// first connection is up, to start the renewal connections' warm-ups beside
// its first try (see WarmUp).
const warmDelay = 5 * time.Millisecond

// WarmUp arms the warm-ups of the renewal connections (see renewals) for a
// Client's first acquisition; the returned func, called with the outcome of
// its first try, settles them. They start when the try's reply is in (or
// its outcome is unknown: the server may be there), or, while the try is
// still out, as soon as a connection is up, looked at every warmDelay. So
// on a fast link the first try runs alone, not against four connection
// set-ups for the CPU and the server (a fresh Client's first TryLock took
// 1.5-5.7 ms on loopback where a cold PING takes 0.65 ms); on a slow one
// the warm-ups start as soon as the server is known to be there, and are
// warm by the hold's first renewal. When the try was never sent (Redis
// could not be reached), they do not start: the next acquisition arms them
// again, and an outage is not met by four more dialling connections.
func (r *Renewals) WarmUp() (settle func(err error)) {
	if r.started.Load() {
		return func(error) {}
	}
	var mu sync.Mutex
	done := false
	var t *time.Timer
	var look func()
	look = func() {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case done:
		case r.rdb.PoolStats().TotalConns > 0:
			done = true
			r.Prepare()
		default:
			t.Reset(warmDelay)
		}
	}
	mu.Lock()
	t = time.AfterFunc(warmDelay, look)
	mu.Unlock()
	return func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if done {
			return
		}
		done = true
		t.Stop()
		if err == nil || errs.IsReply(err) || errs.OutcomeUnknown(err) {
			r.Prepare()
		}
	}
}

// Close waits for warm-ups in flight.
func (r *Renewals) Close() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.warm.Wait()
}
