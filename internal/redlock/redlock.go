// Package redlock is the engine of a Mutex over N independent Redis
// masters, after the Redlock algorithm (see dlock.Redlock for what it
// promises, and the token argument): tries on every master at once with a
// gate for contended ones (try.go), waiting on every master's pub/sub
// (wait.go), renewals and re-acquires on every master (renew.go), and the
// other calls (ops.go), each fanned out with a node timeout (fanout.go).
//
// It owns its masters' connections and pub/sub hubs and a detached
// engine.Core (watchdog, registry of local waiters, telemetry); it calls
// packages engine, lease, wait, pubsub, coalesce, wire, scripts, errs and
// telemetry. Lock order: a try's mu, the seen and calls locks are leaves (a
// try releases its mu before it hands a hold to the watchdog).
package redlock

import (
	"context"
	"hash/fnv"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/coalesce"
	"github.com/dlock-go/dlock/internal/engine"
	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/pubsub"
	"github.com/dlock-go/dlock/internal/scripts"
	"github.com/dlock-go/dlock/internal/telemetry"
	"github.com/dlock-go/dlock/internal/wait"
	"github.com/dlock-go/dlock/internal/wire"
)

// Redlock is the coordinator of a Redlock's Mutexes: its masters and its
// Core.
type Redlock struct {
	Core   *engine.Core // watchdog, local waiters, telemetry; no Redis of its own
	nodes  []*master
	quorum int

	lastToken atomic.Uint64 // the highest token this Redlock issued or saw

	seenMu  sync.Mutex
	seen    map[string]struct{} // release messages already applied (one comes from each master)
	seenLog []string

	// Calls on the masters in flight (see goCall), which Close waits for.
	callsMu   sync.Mutex
	calls     int
	callsIdle *sync.Cond

	closeOnce sync.Once
}

// master is one master of a Redlock.
type master struct {
	rdb   redis.UniversalClient
	co    *coalesce.Coalescer // shares round trips between concurrent calls; nil on a cluster client
	hub   *pubsub.Hub
	index int
	name  string // its address, normalized, or its index when unknown
	// failing is set by a try whose request to the master failed, and
	// cleared by one that it answered: a failing master is no gate.
	failing atomic.Bool
}

// subscriptionLinger keeps a lock's channel subscribed after its last
// waiter leaves (as engine's does).
const subscriptionLinger = 5 * time.Second

// New returns a Redlock over masters with the Client options' cfg; err is
// bad input the caller found. Bad masters (see checkMasters) are found
// here. A Redlock with bad input starts nothing, and every call fails with
// the error.
func New(masters []redis.UniversalClient, cfg engine.Config, tel *telemetry.Telemetry, id string, err error) *Redlock {
	r := &Redlock{quorum: len(masters)/2 + 1, seen: make(map[string]struct{})}
	r.callsIdle = sync.NewCond(&r.callsMu)
	if err == nil {
		err = checkMasters(masters)
	}
	if err == nil && cfg.Sync.Replicas > 0 {
		err = errs.Invalidf("redlock: WithSyncReplicas does not apply to a Redlock")
	}
	r.Core = engine.NewDetached(cfg, tel, id, err, r.sendRenewals)
	if err != nil {
		return r
	}
	for i, m := range masters {
		if rdb, ok := m.(*redis.Client); ok && !rdb.Options().ContextTimeoutEnabled {
			cfg.Logger.Warn("dlock: redlock master without ContextTimeoutEnabled: a call to it that stalls lasts until its ReadTimeout, not the node timeout, and Close waits for it",
				"master", i, "read_timeout", rdb.Options().ReadTimeout.String())
		}
	}
	for i, rdb := range masters {
		n := &master{rdb: rdb, index: i, name: masterName(rdb, i)}
		if _, cluster := rdb.(*redis.ClusterClient); !cluster {
			n.co = coalesce.New(rdb, engine.PipelinesInFlight) // see engine.Core
		}
		n.hub = pubsub.New(rdb, hubHandler{r}, pubsub.Options{Linger: subscriptionLinger, Logger: cfg.Logger})
		r.nodes = append(r.nodes, n)
	}
	return r
}

// checkMasters checks the masters NewRedlock was given.
func checkMasters(masters []redis.UniversalClient) error {
	n := len(masters)
	switch {
	case n < 3:
		return errs.Invalidf("redlock: %d masters; need an odd number, at least 3", n)
	case n%2 == 0:
		return errs.Invalidf("redlock: %d masters; need an odd number (an even one tolerates no more failures than one fewer)", n)
	}
	addrs := make(map[string]int, n)
	for i, m := range masters {
		if engine.IsNilClient(m) {
			return errs.Invalidf("redlock: master %d is a nil client", i)
		}
		for j := range i {
			if masters[j] == m {
				return errs.Invalidf("redlock: masters %d and %d are the same client", j, i)
			}
		}
		var addr string
		switch rdb := m.(type) {
		case *redis.Client:
			o := rdb.Options()
			if o.Addr == "FailoverClient" {
				continue // a Sentinel client: its address is found at run time
			}
			addr = normalAddr(o.Network, o.Addr)
		case *redis.ClusterClient, *redis.Ring:
			return errs.Invalidf("redlock: master %d is a cluster or ring client; each master must be one Redis server", i)
		default:
			continue
		}
		if j, dup := addrs[addr]; dup {
			return errs.Invalidf("redlock: masters %d and %d are the same server (%s)", j, i, addr)
		}
		addrs[addr] = i
	}
	return nil
}

// masterName names master i for gateOf: its address as normalAddr spells it,
// or else its place in the list.
func masterName(m redis.UniversalClient, i int) string {
	if rdb, ok := m.(*redis.Client); ok && rdb.Options().Addr != "FailoverClient" {
		o := rdb.Options()
		return normalAddr(o.Network, o.Addr)
	}
	return "#" + strconv.Itoa(i)
}

// gateOf picks the gate master of the lock whose main key is key
// (try.go): the master whose name hashes highest with the key, so
// that every Client given the same masters, in any order, picks the same one
// for a name, and names spread over the masters.
func gateOf(nodes []*master, key string) int {
	gate, best := -1, uint64(0)
	for _, n := range nodes {
		h := fnv.New64a()
		h.Write([]byte(n.name))
		h.Write([]byte{0})
		h.Write([]byte(key))
		if v := mix64(h.Sum64()); gate < 0 || v > best {
			gate, best = n.index, v
		}
	}
	return gate
}

// mix64 spreads every bit of h over all of them (MurmurHash3's finalizer):
// FNV's high bits hardly depend on the last bytes hashed.
func mix64(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// normalAddr spells a server address so that two spellings of one loopback
// address compare equal: no host or localhost is 127.0.0.1, and no port is
// 6379.
func normalAddr(network, addr string) string {
	if network == "unix" {
		return "unix:" + addr
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		host, port = addr, "6379"
	}
	host = strings.ToLower(host)
	switch host {
	case "", "localhost", "::1", "0.0.0.0", "::":
		host = "127.0.0.1"
	}
	if port == "" {
		port = "6379"
	}
	return net.JoinHostPort(host, port)
}

// run runs internal/scripts/redlock.lua on the master. Concurrent calls to it share
// pipelines (internal/coalesce): a pipeline has the latest deadline of its
// calls, all of which have the node timeout, so a call lasts about as long
// as it would alone.
func (n *master) run(ctx context.Context, keys []string, args ...any) *redis.Cmd {
	if n.co == nil {
		return scripts.Redlock.Run(ctx, n.rdb, keys, args...)
	}
	return n.co.Run(ctx, scripts.Redlock, keys, args...)
}

// keysOf returns the keys of a Redlock Mutex whose main key is key: K, F
// and CH of internal/scripts/redlock.lua.
func keysOf(key string) []string {
	return []string{key, key + redlockFenceSuffix, key + redlockChannelSuffix}
}

// The keys a Redlock Mutex adds to the main key: its fencing counter, which
// expires a lease and redlockFenceMemory after its last raise, and the
// channel its releases go to.
const (
	redlockFenceSuffix   = ":rlf"
	redlockChannelSuffix = ":rlch"
)

// redlockFenceMemory is how long a master's fencing counter outlives the
// lease of the grant that last raised it (see Fencing tokens on Redlock):
// as long as a released lock keeps its last token on a single master.
const redlockFenceMemory = time.Minute

// fenceTTL is the expiry of a fencing counter raised by a grant of lease
// ttl, in ms as the script takes it.
func fenceTTL(ttl time.Duration) string {
	return strconv.FormatInt((ttl + redlockFenceMemory).Milliseconds(), 10)
}

// Close stops the watchdog and the masters' pub/sub connections, waits for
// their goroutines, and waits for the calls still out on the masters (see
// dlock.Redlock.Close). It is idempotent.
func (r *Redlock) Close() error {
	if r.Core.Err != nil {
		return nil
	}
	var err error
	r.closeOnce.Do(func() {
		err = r.Core.Close()
		for _, n := range r.nodes {
			if e := n.hub.Close(); e != nil && err == nil {
				err = e
			}
		}
		r.awaitCalls()
	})
	return err
}

// nodeTimeout is how long a try, release or renewal waits for one master.
func nodeTimeout(ttl time.Duration) time.Duration {
	return min(max(ttl/10, 5*time.Millisecond), 500*time.Millisecond)
}

// proposal is the least token a try asks for: the clock in microseconds, or
// one more than the last token seen, whichever is greater.
func (r *Redlock) proposal() uint64 {
	p := uint64(time.Now().UnixMicro())
	if last := r.lastToken.Load(); last >= p {
		p = last + 1
	}
	return p
}

// sawToken records a token issued on the masters.
func (r *Redlock) sawToken(t uint64) {
	for {
		last := r.lastToken.Load()
		if t <= last || r.lastToken.CompareAndSwap(last, t) {
			return
		}
	}
}

// hubHandler turns release messages from any master into wake-ups of the
// Redlock's local waiters. Each release is published by every master that
// had the key, so a release is applied once, by its holder ID.
type hubHandler struct{ r *Redlock }

func (h hubHandler) Message(channel, payload string) {
	m := wire.DecodeRelease(payload)
	if m.Wake.Kind != wire.KindReleased || len(m.Wake.IDs) != 1 || m.From == h.r.Core.ID {
		return // not a master's release; or this Redlock woke its own waiters
	}
	if !h.r.firstSeen(m.Wake.IDs[0]) {
		return
	}
	h.r.Core.Waits.Wake(channel, wire.WakeOne, wait.WakeRelease)
}

func (h hubHandler) Subscribed(channel string) {
	h.r.Core.Waits.Wake(channel, wire.WakeAll, wait.WakeSubscribed)
}

// released reports whether this Redlock has seen holder's release: from a
// master's message, or as the holder itself. A gate that still refuses for
// such a holder has not applied the release yet (see Mutex.attempt).
func (r *Redlock) released(holder string) bool {
	r.seenMu.Lock()
	defer r.seenMu.Unlock()
	_, ok := r.seen[holder]
	return ok
}

// firstSeen reports whether the release of holder is new to this Redlock,
// and records it.
func (r *Redlock) firstSeen(holder string) bool {
	const remember = 1024
	r.seenMu.Lock()
	defer r.seenMu.Unlock()
	if _, ok := r.seen[holder]; ok {
		return false
	}
	r.seen[holder] = struct{}{}
	r.seenLog = append(r.seenLog, holder)
	if len(r.seenLog) > remember {
		delete(r.seen, r.seenLog[0])
		r.seenLog = r.seenLog[1:]
	}
	return true
}
