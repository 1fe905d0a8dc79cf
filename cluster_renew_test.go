package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/scripts"
)

// Cluster renewals per node (renew_cluster.go), against real 3-master
// clusters: what a renewal period costs, per node against per slot, and
// that no hold is lost when a slot moves, when the servers reject the
// script's flag, or when a master dies.

// renewTally is a go-redis hook, put on every node client of a cluster
// client, that counts renewal script calls (renew.lua per slot, the node
// script per node) and the round trips that carry them: a pipeline on one
// node counts once.
type renewTally struct {
	nodeHashes map[string]bool // SHA1 of the per-node script(s)

	mu                   sync.Mutex
	slotCalls, nodeCalls int
	trips                int
	slotCallsByKey       map[string]int // per-slot renewals, by the first key they carry
	leases               int            // leases the calls carried
}

func newRenewTally(nodeScripts ...string) *renewTally {
	h := &renewTally{nodeHashes: map[string]bool{scripts.RenewNode.Hash(): true}, slotCallsByKey: map[string]int{}}
	for _, src := range nodeScripts {
		h.nodeHashes[redis.NewScript(src).Hash()] = true
	}
	return h
}

func (h *renewTally) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *renewTally) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.count([]redis.Cmder{cmd})
		return err
	}
}

func (h *renewTally) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.count(cmds)
		return err
	}
}

func (h *renewTally) count(cmds []redis.Cmder) {
	h.mu.Lock()
	defer h.mu.Unlock()
	renewal := false
	for _, cmd := range cmds {
		name := strings.ToLower(cmd.Name())
		args := cmd.Args()
		if (name != "evalsha" && name != "eval") || len(args) < 3 {
			continue
		}
		script := fmt.Sprint(args[1])
		if name == "eval" {
			script = redis.NewScript(script).Hash()
		}
		switch {
		case script == scripts.Renew.Hash():
			h.slotCalls++
			n, _ := strconv.Atoi(fmt.Sprint(args[2])) // one key a lease, for Mutexes
			h.leases += n
			if len(args) > 3 {
				h.slotCallsByKey[fmt.Sprint(args[3])]++
			}
		case h.nodeHashes[script]:
			h.nodeCalls++
			if len(args) > 4 {
				n, _ := strconv.Atoi(fmt.Sprint(args[4]))
				h.leases += n
			}
		default:
			continue
		}
		renewal = true
	}
	if renewal {
		h.trips++
	}
}

// take returns the counts since the last take, and resets them.
func (h *renewTally) take() (slotCalls, nodeCalls, trips int, slotByKey map[string]int) {
	slotCalls, nodeCalls, trips, slotByKey, _ = h.takeAll()
	return
}

func (h *renewTally) takeAll() (slotCalls, nodeCalls, trips int, slotByKey map[string]int, leases int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	slotCalls, nodeCalls, trips, slotByKey, leases = h.slotCalls, h.nodeCalls, h.trips, h.slotCallsByKey, h.leases
	h.slotCalls, h.nodeCalls, h.trips, h.slotCallsByKey, h.leases = 0, 0, 0, map[string]int{}, 0
	return
}

// tallied returns a cluster client whose every node client counts into h.
func talliedCluster(t *testing.T, addrs []string, h *renewTally) *redis.ClusterClient {
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, PoolSize: 64})
	rdb.OnNewNode(func(node *redis.Client) { node.AddHook(h) })
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// clusterMasters returns a plain client on each master, by address.
func clusterMasters(t *testing.T, addrs []string) map[string]*redis.Client {
	out := map[string]*redis.Client{}
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		t.Cleanup(func() { _ = c.Close() })
		out[a] = c
	}
	return out
}

// mastersCPU is the CPU time (user and system) the masters have used, all told.
func mastersCPU(t *testing.T, nodes map[string]*redis.Client) time.Duration {
	var total time.Duration
	for _, c := range nodes {
		total += redisCPU(t, c)
	}
	return total
}

// lockAll takes every lock, from 64 goroutines.
func lockAll(t *testing.T, ctx context.Context, locks []*dlock.Mutex) {
	t.Helper()
	failed, err := forEachConcurrently(locks, time.Time{}, func(m *dlock.Mutex) error { return m.Lock(ctx) })
	require.Zerof(t, failed, "%d Locks failed, first: %v", failed, err)
}

// lostCount counts the locks whose Lost channel is closed.
func lostCount(locks []*dlock.Mutex) int {
	n := 0
	for _, m := range locks {
		select {
		case <-m.Lost():
			n++
		default:
		}
	}
	return n
}

// heldOnServer checks, with cluster client probe, that every lock's key is
// there, held by client id, with a lease left; it returns the shortest
// PTTL seen and the number of keys that fail the check.
func heldOnServer(t *testing.T, probe *redis.ClusterClient, locks []*dlock.Mutex, id string) (bad int, minTTL time.Duration) {
	t.Helper()
	ctx := context.Background()
	minTTL = time.Hour
	gets := make([]*redis.StringCmd, len(locks))
	ttls := make([]*redis.DurationCmd, len(locks))
	_, err := probe.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, m := range locks {
			gets[i] = p.HGet(ctx, key(m.Name()), "o")
			ttls[i] = p.PTTL(ctx, key(m.Name()))
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		require.NoError(t, err)
	}
	for i := range locks {
		v, err := gets[i].Result()
		d := ttls[i].Val()
		if err != nil || !strings.HasPrefix(v, id+".") || d <= 0 {
			bad++
			continue
		}
		minTTL = min(minTTL, d)
	}
	return bad, minTTL
}

// renewCost is what one mode of renewals cost over a window: per period,
// and per round of holds renewals (holds leases renewed), which does not
// depend on how the window cuts the rounds.
type renewCost struct {
	holds                               int
	slotCalls, nodeCalls, trips, leases float64 // per period
	cpu                                 time.Duration
}

// perRound scales a figure per period to one renewal of every hold.
func (c renewCost) perRound(x float64) float64 { return x * float64(c.holds) / max(c.leases, 1) }

func (c renewCost) String() string {
	return fmt.Sprintf("%.0f leases renewed/period; %.1f script calls/period (%.1f per slot, %.1f per node), %.1f round trips/period, "+
		"redis CPU %v/period (3 masters); per round of all %d holds: %.1f script calls, %.1f round trips, redis CPU %v",
		c.leases, c.slotCalls+c.nodeCalls, c.slotCalls, c.nodeCalls, c.trips, c.cpu.Round(100*time.Microsecond),
		c.holds, c.perRound(c.slotCalls+c.nodeCalls), c.perRound(c.trips), time.Duration(c.perRound(float64(c.cpu))).Round(100*time.Microsecond))
}

// measure counts renewals over the given number of periods.
func measure(t *testing.T, h *renewTally, nodes map[string]*redis.Client, holds int, period time.Duration, periods int) renewCost {
	h.take()
	cpu0, start := mastersCPU(t, nodes), time.Now()
	time.Sleep(time.Duration(periods) * period)
	slot, node, trips, _, leases := h.takeAll()
	cpu, watched := mastersCPU(t, nodes)-cpu0, time.Since(start)
	p := float64(watched) / float64(period)
	return renewCost{holds: holds, slotCalls: float64(slot) / p, nodeCalls: float64(node) / p, trips: float64(trips) / p,
		leases: float64(leases) / p, cpu: time.Duration(float64(cpu) / p)}
}

// Many holds on a 3-master cluster: renewals per node cost about what they
// cost on a single Redis (holds/100 script calls a period), where renewals
// per slot cost about one call per slot in use. Both are measured in the
// same run, on the same holds; no hold expires.
func runClusterRenewalCost(t *testing.T, holds int) {
	addrs := redistest.Cluster(t, 3)
	nodes := clusterMasters(t, addrs)
	h := newRenewTally()
	const timeout = 3 * time.Second
	period := timeout / 3
	c := dlock.New(talliedCluster(t, addrs, h), dlock.WithWatchdogTimeout(timeout))
	t.Cleanup(func() { _ = c.Close() })
	probe := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = probe.Close() })
	ctx := ctxTimeout(t, 2*time.Minute)

	locks := make([]*dlock.Mutex, holds)
	prefix := name(t)
	for i := range locks {
		locks[i] = c.Mutex(prefix + "-" + strconv.Itoa(i))
	}
	start := time.Now()
	lockAll(t, ctx, locks)
	t.Logf("%d holds taken in %v", holds, time.Since(start).Round(time.Millisecond))

	// A period for the rounds to draw together, then per node, then per
	// slot (after a period to switch), then per node again to end with.
	time.Sleep(period)
	perNode := measure(t, h, nodes, holds, period, 2)
	dlock.SetPerSlotRenewals(c, true)
	time.Sleep(period)
	perSlot := measure(t, h, nodes, holds, period, 2)
	dlock.SetPerSlotRenewals(c, false)

	t.Logf("%d holds, 3 masters, %v watchdog (period %v):", holds, timeout, period)
	t.Logf("  per slot (before): %s", perSlot)
	t.Logf("  per node (after):  %s", perNode)

	// Per node: about holds/100 calls (100 keys a call), plus the
	// part-filled calls of each node and round: within 10% (the issue's
	// target: 110 for 10,000 holds).
	bound := float64(holds) / 100 * 1.1
	assert.LessOrEqual(t, perNode.perRound(perNode.slotCalls+perNode.nodeCalls), bound, "script calls per round of every hold, per node")
	// Each lease is renewed once a period, up to twice when round trips are
	// long (the period shrinks to a sixth of the lease: internal/lease's
	// Watchdog.period), and up to a quarter of a period early. The per-slot
	// baseline's many calls make its round trips long on a loaded machine:
	// 14,161 renewals a period for 10,000 holds in one CI run.
	for _, m := range []struct {
		what   string
		leases float64
	}{{"per node", perNode.leases}, {"per slot", perSlot.leases}} {
		assert.GreaterOrEqual(t, m.leases, 0.65*float64(holds), "leases renewed per period, %s", m.what)
		assert.LessOrEqual(t, m.leases, 2.5*float64(holds), "leases renewed per period, %s", m.what)
	}
	assert.Zero(t, perNode.slotCalls, "no per-slot calls while the nodes take the node script")
	assert.Positive(t, perNode.nodeCalls)
	// Per slot: the baseline really went per slot, one call a slot in use.
	assert.Zero(t, perSlot.nodeCalls, "no per-node calls while forced per slot")
	assert.Greater(t, perSlot.slotCalls, 5*perNode.nodeCalls, "per slot costs many times the calls")

	bad, minTTL := heldOnServer(t, probe, locks, c.ID())
	assert.Zero(t, bad, "keys missing, held by another or without a lease")
	assert.Zero(t, lostCount(locks), "holds reported lost")
	assert.Greater(t, minTTL, timeout/3, "every key renewed within a period")
	t.Logf("  all %d keys held with a lease left (shortest PTTL %v); no hold lost", holds, minTTL)
}

func TestCluster_Renewals_PerNode_10kHolds_ScriptCallsPerPeriod(t *testing.T) {
	long(t)
	if testing.Short() {
		t.Skip("-short")
	}
	runClusterRenewalCost(t, 10_000)
}

// A slot migrated while its keys are held: first half moved (the slot
// MIGRATING on its node, IMPORTING on the other), then all, and the slot
// given to the new node. The node script answers -1 for the keys it no
// longer has, and the sender renews them per slot (through the ASK and
// MOVED redirects) in the same round: no hold is lost, and the moved keys
// keep their lease on the new node.
func TestCluster_Renewals_SlotMigratedMidHold_MovedHoldsStillRenewed(t *testing.T) {
	long(t)
	addrs := redistest.Cluster(t, 3)
	nodes := clusterMasters(t, addrs)
	h := newRenewTally()
	const timeout = time.Second
	c := dlock.New(talliedCluster(t, addrs, h), dlock.WithWatchdogTimeout(timeout))
	t.Cleanup(func() { _ = c.Close() })
	probe := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = probe.Close() })
	ctx := ctxTimeout(t, time.Minute)

	// Six locks in one slot, and bystanders all over.
	var moving []string
	slot := -1
	for i := 0; len(moving) < 6; i++ {
		n := fmt.Sprintf("%s-m%d", name(t), i)
		switch s := dlock.KeySlot(key(n)); {
		case slot < 0:
			slot = s
		case s != slot:
			continue
		}
		moving = append(moving, n)
	}
	var locks []*dlock.Mutex
	for _, n := range moving {
		locks = append(locks, c.Mutex(n))
	}
	for i := 0; len(locks) < len(moving)+100; i++ {
		// Bystanders stay out of the moving slot: one in it would be left
		// behind on the old node (only the moving keys migrate), and lost
		// (CI: 1 of 100 did, about 1 run in 160).
		if n := fmt.Sprintf("%s-b%d", name(t), i); dlock.KeySlot(key(n)) != slot {
			locks = append(locks, c.Mutex(n))
		}
	}
	lockAll(t, ctx, locks)

	srcNode, err := probe.MasterForKey(ctx, key(moving[0]))
	require.NoError(t, err)
	src := srcNode.Options().Addr
	var dst string
	for _, a := range addrs {
		if a != src {
			dst = a
			break
		}
	}
	id := func(a string) string {
		v, err := nodes[a].Do(ctx, "cluster", "myid").Text()
		require.NoError(t, err)
		return v
	}
	srcID, dstID := id(src), id(dst)
	host, port, _ := strings.Cut(dst, ":")
	migrate := func(names []string) {
		args := []any{"migrate", host, port, "", 0, 5000, "keys"}
		for _, n := range names {
			args = append(args, key(n), key(n)+":f") // the lock and its token memory
		}
		require.NoError(t, nodes[src].Do(ctx, args...).Err())
	}

	require.NoError(t, nodes[dst].Do(ctx, "cluster", "setslot", slot, "importing", srcID).Err())
	require.NoError(t, nodes[src].Do(ctx, "cluster", "setslot", slot, "migrating", dstID).Err())
	migrate(moving[:3])
	h.take()
	time.Sleep(timeout + timeout/3) // four periods half migrated: unrenewed keys would be gone
	slotCalls, nodeCalls, _, byKey := h.take()
	assert.Zero(t, lostCount(locks), "holds lost while the slot was half migrated")
	for i, n := range moving {
		node, k := nodes[src], key(n)
		if i < 3 {
			node = nodes[dst]
		}
		var get *redis.StringCmd
		var ttl *redis.DurationCmd
		_, err := node.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.Do(ctx, "asking")
			get = p.HGet(ctx, k, "o")
			p.Do(ctx, "asking")
			ttl = p.PTTL(ctx, k)
			return nil
		})
		require.NoError(t, err, "read %s", k)
		assert.True(t, strings.HasPrefix(get.Val(), c.ID()+"."), "holder of %s: %q", k, get.Val())
		assert.Greater(t, ttl.Val(), timeout/3, "lease left on %s (moved: %v)", k, i < 3)
	}
	for _, n := range moving[:3] {
		assert.GreaterOrEqual(t, byKey[key(n)], 3, "the moved key %s renewed per slot every period", n)
	}
	for _, n := range moving[3:] {
		assert.Zero(t, byKey[key(n)], "the key %s still on its node renewed per node only", n)
	}
	t.Logf("half migrated, over 4 periods: %d per-node and %d per-slot script calls", nodeCalls, slotCalls)

	// The rest moves, and the slot is the new node's.
	migrate(moving[3:])
	for _, a := range addrs {
		require.NoError(t, nodes[a].Do(ctx, "cluster", "setslot", slot, "node", dstID).Err())
	}
	time.Sleep(timeout + timeout/3)
	slotCalls, nodeCalls, _, _ = h.take()
	assert.Zero(t, lostCount(locks), "holds lost after the slot moved")
	for _, n := range moving {
		v, err := nodes[dst].HGet(ctx, key(n), "o").Result()
		require.NoError(t, err, "%s on the new node", n)
		assert.True(t, strings.HasPrefix(v, c.ID()+"."))
		d, err := nodes[dst].PTTL(ctx, key(n)).Result()
		require.NoError(t, err)
		assert.Greater(t, d, timeout/3, "lease left on %s", n)
	}
	bad, _ := heldOnServer(t, probe, locks, c.ID())
	assert.Zero(t, bad, "keys missing or without a lease")
	t.Logf("slot moved, over 4 periods: %d per-node and %d per-slot script calls", nodeCalls, slotCalls)
	for _, m := range locks {
		require.NoError(t, m.Unlock(ctx))
	}
}

// A cluster whose servers reject the script's shebang, as Redis before 7.0
// does: emulated on Redis 7 by the node script with '#' for '#!', which it
// fails to compile with Redis 6's very error. Renewals then go per slot,
// for good, from the first round on; no hold is lost; the Client says so
// once in its log.
func TestCluster_Renewals_ShebangRejected_FallBackPerSlot(t *testing.T) {
	long(t)
	addrs := redistest.Cluster(t, 3)
	old := "#" + strings.TrimPrefix(scripts.Source("renew_node.lua"), "#!")
	h := newRenewTally(old)
	logs := &logTally{}
	const timeout = time.Second
	c := dlock.New(talliedCluster(t, addrs, h), dlock.WithWatchdogTimeout(timeout), dlock.WithLogger(slog.New(logs)))
	t.Cleanup(func() { _ = c.Close() })
	dlock.SetRenewNodeScript(c, old)
	probe := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = probe.Close() })
	ctx := ctxTimeout(t, time.Minute)

	locks := make([]*dlock.Mutex, 300)
	for i := range locks {
		locks[i] = c.Mutex(fmt.Sprintf("%s-%d", name(t), i))
	}
	lockAll(t, ctx, locks)
	time.Sleep(timeout) // three periods
	_, firstNode, _, _ := h.take()
	assert.True(t, dlock.PerSlotRenewals(c), "per node turned off")
	assert.Positive(t, firstNode, "the node script was tried")
	time.Sleep(2 * timeout / 3)
	slotCalls, nodeCalls, _, _ := h.take()
	assert.Zero(t, nodeCalls, "never tried again")
	assert.Positive(t, slotCalls, "renewed per slot")
	assert.Zero(t, lostCount(locks), "holds lost")
	bad, minTTL := heldOnServer(t, probe, locks, c.ID())
	assert.Zero(t, bad, "keys missing or without a lease")
	assert.Greater(t, minTTL, timeout/3)

	logs.mu.Lock()
	notices := 0
	for msg, e := range logs.byMsg {
		if strings.Contains(msg, "allow-cross-slot-keys") {
			notices += e.n
			assert.Contains(t, msg, "Error compiling script (new function)")
		}
	}
	logs.mu.Unlock()
	assert.Equal(t, 1, notices, "logged once: %s", logs)
	t.Logf("node script tried in %d calls, then per slot: %d calls over 2 periods for 300 holds", firstNode, slotCalls)
}

// replyErr is an error reply from Redis, as go-redis returns it.
type replyErr string

func (e replyErr) Error() string { return string(e) }
func (replyErr) RedisError()     {}

// What turns renewals per node off: the servers' refusal of the shebang, in
// the words of each version; nothing else.
func TestCluster_Renewals_RejectsScriptFlags_ClassifiesServerErrors(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		// Redis 6.x (and 5.x) compile the script body inside a function:
		// scripting.c luaCreateFunction, "Error compiling script (new
		// function): %s\n", the newline sent as a space.
		{replyErr("ERR Error compiling script (new function): user_script:1: unexpected symbol near '#' "), true},
		// Redis 7 with a flag it does not know, an engine or a shebang it
		// cannot read (eval.c evalExtractShebangFlags).
		{replyErr("ERR Unexpected flag in script shebang: allow-cross-slot-keys"), true},
		{replyErr("ERR Unexpected engine in script shebang: lua5"), true},
		{replyErr("ERR Invalid script shebang"), true},
		// Not a refusal of the flag: these go per slot for the round only.
		{replyErr("NOSCRIPT No matching script. Please use EVAL."), false},
		{replyErr("ERR Script attempted to access a non local key in a cluster node script"), false},
		{replyErr("BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE."), false},
		{replyErr("CLUSTERDOWN The cluster is down"), false},
		{replyErr("READONLY You can't write against a read only replica."), false},
		{replyErr("LOADING Redis is loading the dataset in memory"), false},
		{replyErr("OOM command not allowed when used memory > 'maxmemory'."), false},
		{errors.New("dial tcp 127.0.0.1:1: connect: connection refused"), false},
		{fmt.Errorf("read: %w", errors.New("Error compiling script")), false}, // not a reply from Redis
		{context.DeadlineExceeded, false},
	} {
		assert.Equal(t, tc.want, dlock.RejectsScriptFlags(tc.err), "%v", tc.err)
	}
}

// A master dies (killed, or hung: stopped, so that requests to it wait):
// its holds are lost, each signalled by Lost and ErrLost within a lease;
// the other masters' holds keep being renewed on time, none lost. Two
// Clients hold locks on the same cluster: one renewing per node, one forced
// per slot (the fallback for servers without script flags), which also
// sends each node's calls on their own.
func TestCluster_Renewals_MasterDown_OthersRenewedOnTime(t *testing.T) {
	long(t)
	for _, tc := range []struct {
		how string
		sig syscall.Signal
	}{{"killed", syscall.SIGKILL}, {"hung", syscall.SIGSTOP}} {
		t.Run(tc.how, func(t *testing.T) { runMasterDown(t, tc.sig) })
	}
}

// downWatch is one Client's holds in runMasterDown.
type downWatch struct {
	mode         string
	c            *dlock.Client
	doomed, live []*dlock.Mutex
	lostAt       sync.Map // doomed *dlock.Mutex -> when its hold context ended
	lostWrong    atomic.Int32
	minTTL       time.Duration
}

func runMasterDown(t *testing.T, sig syscall.Signal) {
	addrs := redistest.Cluster(t, 3)
	nodes := clusterMasters(t, addrs)
	ctx := ctxTimeout(t, time.Minute)
	for _, c := range nodes { // the others go on serving their slots
		require.NoError(t, c.ConfigSet(ctx, "cluster-require-full-coverage", "no").Err())
	}
	const timeout = time.Second
	probe := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = probe.Close() })
	victim := addrs[2]

	watches := []*downWatch{{mode: "per node"}, {mode: "per slot"}}
	for _, w := range watches {
		w.c = dlock.New(talliedCluster(t, addrs, newRenewTally()), dlock.WithWatchdogTimeout(timeout), dlock.WithLogger(slog.New(&logTally{})))
		t.Cleanup(func() { _ = w.c.Close() })
		dlock.SetPerSlotRenewals(w.c, w.mode == "per slot")
		locks := make([]*dlock.Mutex, 150)
		for i := range locks {
			locks[i] = w.c.Mutex(fmt.Sprintf("%s-%s-%d", name(t), w.mode, i))
		}
		lockAll(t, ctx, locks)
		for _, m := range locks {
			n, err := probe.MasterForKey(ctx, key(m.Name()))
			require.NoError(t, err)
			if n.Options().Addr == victim {
				w.doomed = append(w.doomed, m)
			} else {
				w.live = append(w.live, m)
			}
		}
		require.NotEmpty(t, w.doomed)
		require.NotEmpty(t, w.live)
		// Each doomed hold's end, as its hold context reports it.
		for _, m := range w.doomed {
			hctx, cancel := m.HoldContext(context.Background())
			t.Cleanup(cancel)
			context.AfterFunc(hctx, func() {
				w.lostAt.Store(m, time.Now())
				if !errors.Is(context.Cause(hctx), dlock.ErrLost) {
					w.lostWrong.Add(1)
				}
			})
		}
		w.minTTL = time.Hour
	}
	info, err := nodes[victim].Info(ctx, "server").Result()
	require.NoError(t, err)
	pidText, ok := infoField(info, "process_id")
	require.True(t, ok)
	pid, err := strconv.Atoi(pidText)
	require.NoError(t, err)
	proc, err := os.FindProcess(pid)
	require.NoError(t, err)
	t.Cleanup(func() { _ = proc.Signal(syscall.SIGCONT) })

	time.Sleep(timeout / 2)
	require.NoError(t, proc.Signal(sig))
	down := time.Now()

	// Watch the live holds on their masters until the dead one's are all
	// lost (a lease).
	alive := map[string]*redis.Client{}
	for a, n := range nodes {
		if a != victim {
			alive[a] = n
		}
	}
	for time.Since(down) < timeout+400*time.Millisecond {
		for _, w := range watches {
			bad, d := heldOnServerSome(t, alive, w.live, w.c.ID())
			require.Zero(t, bad, "%s: a live hold's key went missing", w.mode)
			w.minTTL = min(w.minTTL, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, w := range watches {
		assert.Zero(t, lostCount(w.live), "%s: holds on the live masters lost", w.mode)
		assert.Greater(t, w.minTTL, timeout/3, "%s: the live masters' keys renewed on time", w.mode)
		assert.Equal(t, len(w.doomed), lostCount(w.doomed), "%s: every hold on the dead master reported lost", w.mode)
		assert.Zero(t, w.lostWrong.Load(), "%s: hold contexts ended without ErrLost", w.mode)
		var latest time.Duration
		w.lostAt.Range(func(_, v any) bool {
			latest = max(latest, v.(time.Time).Sub(down))
			return true
		})
		assert.LessOrEqual(t, latest, timeout+200*time.Millisecond, "%s: lost signalled within a lease of the master's death", w.mode)
		t.Logf("%s, master %v: %d holds lost (the last %v after), %d live holds kept, shortest PTTL on the live masters %v",
			w.mode, sig, len(w.doomed), latest.Round(time.Millisecond), len(w.live), w.minTTL)
	}
}

// heldOnServerSome checks the locks' keys on the given masters directly
// (not through the cluster client, which may be busy with a dead master):
// every key is on one of them, held by client id, with a lease left.
func heldOnServerSome(t *testing.T, nodes map[string]*redis.Client, locks []*dlock.Mutex, id string) (bad int, minTTL time.Duration) {
	t.Helper()
	ctx := context.Background()
	minTTL = time.Hour
	found := make([]bool, len(locks))
	for _, c := range nodes {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		gets := make([]*redis.StringCmd, len(locks))
		ttls := make([]*redis.DurationCmd, len(locks))
		_, err := c.Pipelined(cctx, func(p redis.Pipeliner) error {
			for i, m := range locks {
				gets[i] = p.HGet(cctx, key(m.Name()), "o")
				ttls[i] = p.PTTL(cctx, key(m.Name()))
			}
			return nil
		})
		cancel()
		if err != nil && !isMovedOrNil(err) {
			require.NoError(t, err, "read keys on %s", c.Options().Addr)
		}
		for i := range locks {
			v, err := gets[i].Result()
			if err != nil {
				continue // missing, or another master's key
			}
			found[i] = true
			if !strings.HasPrefix(v, id+".") || ttls[i].Val() <= 0 {
				bad++
				continue
			}
			minTTL = min(minTTL, ttls[i].Val())
		}
	}
	for _, f := range found {
		if !f {
			bad++
		}
	}
	return bad, minTTL
}

func isMovedOrNil(err error) bool {
	return errors.Is(err, redis.Nil) || strings.HasPrefix(err.Error(), "MOVED ")
}
