package dlock

import (
	"context"
	"hash/fnv"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/internal/wait"

	"github.com/dlock-go/dlock/internal/lease"
	"github.com/dlock-go/dlock/internal/telemetry"
	"github.com/dlock-go/dlock/internal/wire"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/coalesce"
	"github.com/dlock-go/dlock/internal/pubsub"
	"github.com/dlock-go/dlock/internal/scripts"
)

// Redlock is a Mutex over N independent Redis masters (N odd, at least 3),
// after the Redlock algorithm: a lock is held when a majority of the masters
// (N/2+1, the quorum) granted it within its validity. It survives the loss
// of up to N/2 masters, which one Redis, even with replicas, does not.
//
// Make one with NewRedlock and take Mutex handles from it; a Redlock Mutex
// is the same *Mutex type as a Client's and behaves like one (Lock, TryLock,
// Unlock, Extend, Lost, HoldContext, Token, spans), with these differences:
//
//   - Acquiring. Each try asks every master at once, each with a timeout of
//     its own, the node timeout (a tenth of the lease, between 5ms and
//     500ms): the call waits for a master's answer that long (and a quarter
//     more), then counts it as failed. The request itself carries the node
//     timeout as its context's deadline, which go-redis applies to the
//     socket only on clients with Options.ContextTimeoutEnabled; without it
//     a request to a stalled master goes on in the background until the
//     client's ReadTimeout (see Close). A try is granted as soon as a quorum
//     granted it. Lock and TryLock return when their context ends, even
//     with requests out: the try is then given back in the background. The hold's validity is measured on the
//     monotonic clock from when the try was sent: lease − elapsed − drift
//     (1% of the lease and 2ms). A try that fails to reach the quorum, or
//     whose validity is below a third of the lease, is given back on every
//     master, including masters that answer late.
//   - Renewing. The watchdog renews the hold on every master in parallel,
//     and re-acquires it, with the same token, on masters that lost the key
//     (restarted or flushed) while the quorum still holds it. The hold's
//     deadline moves forward only when a quorum renewed it. When a renewal
//     shows that a quorum can no longer be kept (too many masters no longer
//     have the key), or the deadline passes because renewals did not reach
//     a quorum in time, the hold is lost: Lost fires and hold contexts are
//     cancelled, at the latest when the quorum's leases may have run out.
//   - Waiting. A blocked Lock waits for a release message from any master
//     (pub/sub on every master, no polling). Waiters of one Redlock are
//     woken in arrival order; across processes, whoever gets a quorum first
//     wins: there is no queue in Redis, since queues on independent masters
//     would not agree on an order. A try that split the votes with another
//     waits a short random time before trying again.
//   - Fencing tokens: see the section below.
//   - IsLocked and TTL report what a quorum of the masters says; ForceUnlock
//     frees the lock on every master.
//
// # Fencing tokens
//
// Each master keeps, per lock name, F: the highest token it has seen, in a
// key that expires a minute (redlockFenceMemory) after the lease of the
// grant that last raised it, so that no counter is kept for good. A try
// proposes a token P (the caller's clock in microseconds, or one more than
// the last token this Redlock saw if that is greater); each master that
// grants it issues max(F+1, P) and raises F to it. The hold's token T is
// the maximum over the masters that granted it; before the call returns, T
// is written back (F := max(F, T), only while the key is still the
// caller's) to the granting masters that issued less, and the acquisition
// succeeds only if a quorum has F >= T: the set W of masters that saw T is
// a majority.
//
// Why tokens strictly increase: let hold B follow hold A (B was granted
// after A ended, on a quorum G). W(A) and G are both majorities, so they
// share a master m. On m, A's grant or write-back (made while m's key was
// A's) came before B's grant (made when m's key was free again), so when B
// was granted, m's F was at least T(A), and m issued B at least T(A)+1;
// T(B), a maximum that includes m's, is greater than T(A).
//
// Unless m's F expired meanwhile: then B was granted more than a lease and
// a minute after A's grant. Every proposal is a clock reading (or a token
// seen, itself from one), and a token exceeds the proposals behind it only
// by one per grant, so if the callers' clocks agree within 30 seconds,
// T(A) is at most 30 seconds ahead of the time of A's grant, and B's
// proposal, at least a minute later, is at most 30 seconds behind: T(B) >
// T(A) all the same. That is the assumption of the expiry.
//
// The other assumption: m kept its data between the two. A master that
// loses it (a restart without persistence, a FLUSHALL) forgets F. To keep the
// argument, such a master must stay out, after restarting, for at least one
// maximum lease (the Redlock "delayed restart"), and the masters' and
// clients' clocks must agree within that lease: then any hold A whose token
// only m still remembered was granted at least a lease before B, and B's
// proposal P, a clock reading, already exceeds T(A). Without the delayed
// restart, tokens may repeat, and exclusion itself may fail (m may help a
// second caller reach a quorum while A still holds). The delayed restart is
// the operator's to arrange (or persistence with appendfsync always); dlock
// cannot tell a master that restarted empty from a new one. What dlock does
// for a master that comes back empty: the holder's watchdog re-acquires the
// key there with its own token T, which also raises that master's F to T,
// and a master's F never helps issue a token below it.
type Redlock struct {
	c      *Client // the coordinator: watchdog, local waiters, telemetry; no Redis of its own
	nodes  []*rlNode
	quorum int
	err    error

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

// rlNode is one master of a Redlock.
type rlNode struct {
	rdb   redis.UniversalClient
	co    *coalesce.Coalescer // shares round trips between concurrent calls; nil on a cluster client
	hub   *pubsub.Hub
	index int
	name  string // its address, normalized, or its index when unknown
	// failing is set by a try whose request to the master failed, and
	// cleared by one that it answered: a failing master is no gate.
	failing atomic.Bool
}

// NewRedlock returns a Redlock over masters, independent Redis masters (no
// two may be the same server, nor replicas of each other), which must be an
// odd number of at least 3. Options are those of New, and apply to every
// master: WithWatchdogTimeout sets the lease of watchdog holds, and so on.
// WithSyncReplicas does not apply.
//
// NewRedlock sends nothing. Fewer than 3 masters, an even number, a nil
// client, two clients on the same address, a cluster or ring client, or an
// invalid option make every later call (on the Redlock and its handles)
// return an error wrapping ErrInvalid. dlock does not close the masters.
//
// Give the masters' clients ContextTimeoutEnabled: true, so that a request
// to a master that stalls ends at its node timeout (see Acquiring below);
// NewRedlock logs a warning (WithLogger) for a *redis.Client without it.
func NewRedlock(masters []redis.UniversalClient, opts ...Option) *Redlock {
	cfg := defaultConfig()
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	c := &Client{cfg: cfg, id: wire.NewClientID(cfg.name), err: cfg.err, holds: make(map[string]*lease.Hold), gates: make(map[string]*ownerGate)}
	c.tel = telemetry.New(cfg.tracerProvider, cfg.meterProvider, cfg.nameAttr)
	r := &Redlock{c: c, quorum: len(masters)/2 + 1, seen: make(map[string]struct{})}
	r.callsIdle = sync.NewCond(&r.callsMu)
	if c.err == nil {
		c.err = checkMasters(masters)
	}
	if c.err == nil && cfg.sync.replicas > 0 {
		c.err = invalidf("redlock: WithSyncReplicas does not apply to a Redlock")
	}
	if c.err != nil {
		r.err = c.err
		c.closed.Store(true)
		return r
	}
	for i, m := range masters {
		if rdb, ok := m.(*redis.Client); ok && !rdb.Options().ContextTimeoutEnabled {
			cfg.logger.Warn("dlock: redlock master without ContextTimeoutEnabled: a call to it that stalls lasts until its ReadTimeout, not the node timeout, and Close waits for it",
				"master", i, "read_timeout", rdb.Options().ReadTimeout.String())
		}
	}
	c.waits = wait.NewRegistry()
	c.loop = &wait.Loop{Reg: c.waits, Tel: c.tel, Timeout: cfg.watchdog} // no Hub: each master has its own (see redlock_wait.go)
	c.outage = &lease.Outage{Log: cfg.logger}
	c.wd = lease.NewWatchdog(cfg.watchdog, r.sendRenewals, false, c.tel, c.outage)
	for i, rdb := range masters {
		n := &rlNode{rdb: rdb, index: i, name: masterName(rdb, i)}
		if _, cluster := rdb.(*redis.ClusterClient); !cluster {
			n.co = coalesce.New(rdb, pipelinesInFlight) // see Client.co
		}
		n.hub = pubsub.New(rdb, rlHubHandler{r}, pubsub.Options{Linger: subscriptionLinger, Logger: cfg.logger})
		r.nodes = append(r.nodes, n)
	}
	return r
}

// checkMasters checks the masters NewRedlock was given.
func checkMasters(masters []redis.UniversalClient) error {
	n := len(masters)
	switch {
	case n < 3:
		return invalidf("redlock: %d masters; need an odd number, at least 3", n)
	case n%2 == 0:
		return invalidf("redlock: %d masters; need an odd number (an even one tolerates no more failures than one fewer)", n)
	}
	addrs := make(map[string]int, n)
	for i, m := range masters {
		if isNil(m) {
			return invalidf("redlock: master %d is a nil client", i)
		}
		for j := range i {
			if masters[j] == m {
				return invalidf("redlock: masters %d and %d are the same client", j, i)
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
			return invalidf("redlock: master %d is a cluster or ring client; each master must be one Redis server", i)
		default:
			continue
		}
		if j, dup := addrs[addr]; dup {
			return invalidf("redlock: masters %d and %d are the same server (%s)", j, i, addr)
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
// (redlock_try.go): the master whose name hashes highest with the key, so
// that every Client given the same masters, in any order, picks the same one
// for a name, and names spread over the masters.
func gateOf(nodes []*rlNode, key string) int {
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

// Mutex returns a handle on the lock called name over the Redlock's masters.
// It sends nothing. WithLease gives holds a fixed lease; WithHandleOwner does
// not apply. An empty name or an invalid option makes every method return an
// error wrapping ErrInvalid.
func (r *Redlock) Mutex(name string, opts ...LockOption) *Mutex {
	m := r.c.newMutex(telemetry.KindMutex, name, opts)
	m.rl = &rlMutex{r: r, m: m, keys: redlockKeys(m.key), gate: gateOf(r.nodes, m.key)}
	return m
}

// run runs internal/scripts/redlock.lua on the master. Concurrent calls to it share
// pipelines (internal/coalesce): a pipeline has the latest deadline of its
// calls, all of which have the node timeout, so a call lasts about as long
// as it would alone.
func (n *rlNode) run(ctx context.Context, keys []string, args ...any) *redis.Cmd {
	if n.co == nil {
		return scripts.Redlock.Run(ctx, n.rdb, keys, args...)
	}
	return n.co.Run(ctx, scripts.Redlock, keys, args...)
}

// redlockKeys returns the keys of a Redlock Mutex whose main key is key: K,
// F and CH of internal/scripts/redlock.lua.
func redlockKeys(key string) []string {
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

// Close stops the watchdog and the pub/sub connections, and waits for their
// goroutines to exit, as Client.Close does: blocked calls return ErrClosed,
// later calls fail with ErrClosed, and holds still open are reported lost
// (they expire by their leases). It also waits for the requests still out
// on the masters (a master's late answer to a try, a give-back): with
// ContextTimeoutEnabled on the masters' clients each ends by its node
// timeout; without it, a request to a stalled master may last until its
// client's ReadTimeout (forever with -1), and Close waits as long, or a few
// times as long when a give-back follows a late answer. It does not close
// the masters' clients. Close is idempotent.
func (r *Redlock) Close() error {
	if r.err != nil {
		return nil
	}
	var err error
	r.closeOnce.Do(func() {
		c := r.c
		c.closed.Store(true)
		c.waits.Close()
		c.wd.Close()
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

// rlHubHandler turns release messages from any master into wake-ups of the
// Redlock's local waiters. Each release is published by every master that
// had the key, so a release is applied once, by its holder ID.
type rlHubHandler struct{ r *Redlock }

func (h rlHubHandler) Message(channel, payload string) {
	m := wire.DecodeRelease(payload)
	if m.Wake.Kind != wire.KindReleased || len(m.Wake.IDs) != 1 || m.From == h.r.c.id {
		return // not a master's release; or this Redlock woke its own waiters
	}
	if !h.r.firstSeen(m.Wake.IDs[0]) {
		return
	}
	h.r.c.waits.Wake(channel, wire.WakeOne, wait.WakeRelease)
}

func (h rlHubHandler) Subscribed(channel string) {
	h.r.c.waits.Wake(channel, wire.WakeAll, wait.WakeSubscribed)
}

// released reports whether this Redlock has seen holder's release: from a
// master's message, or as the holder itself. A gate that still refuses for
// such a holder has not applied the release yet (see rlMutex.attempt).
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
