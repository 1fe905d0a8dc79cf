package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/scripts"
)

// Permit cohorting (WithPermitCohort, on by default): a Permit's Release
// hands it to an Acquire of its Client waiting for as many permits, with
// no round trip before that Acquire returns; its token comes from sem_pass,
// sent as it is handed on.

// scriptGate is a go-redis hook that holds every call of one script until
// it is opened, counting the calls.
type scriptGate struct {
	s    *redis.Script
	open chan struct{}
	once sync.Once
	n    atomic.Int64
}

// newScriptGate returns a closed gate for s, which opens at the end of the
// test at the latest (a Client's Close waits for its calls).
func newScriptGate(t *testing.T, s *redis.Script) *scriptGate {
	g := &scriptGate{s: s, open: make(chan struct{})}
	t.Cleanup(g.Open)
	return g
}

// Open lets the held calls, and all later ones, through.
func (g *scriptGate) Open() { g.once.Do(func() { close(g.open) }) }

func (g *scriptGate) DialHook(next redis.DialHook) redis.DialHook { return next }
func (g *scriptGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (g *scriptGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isScript(cmd, g.s) {
			g.n.Add(1)
			select {
			case <-g.open:
			case <-ctx.Done(): // the caller's Client closed
				return ctx.Err()
			}
		}
		return next(ctx, cmd)
	}
}

func TestSemaphoreCohort_ReleaseHandsThePermitOn_BeforeAnyRoundTrip_TokenIssuedAfter(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 20*time.Second)
	gate := newScriptGate(t, scripts.SemPass)
	releases := &scriptCalls{s: scripts.SemRelease}
	rdb := e.rdb(gate, releases)
	c := e.client(rdb)
	tries := &scriptCalls{s: scripts.SemTry}
	rdb.AddHook(tries)
	s, p := allPermitsHeld(t, ctx, c, n, 1, dlock.WithPermitCohort(0, time.Minute))
	// The first waiter queues in Redis; the second, with another of its
	// Client waiting, waits for a handoff only, and sends nothing.
	got1 := queuedSemWaiter(t, ctx, rdb, c, s, n, 1, 1)
	triedBefore := tries.n.Load()
	got2 := localSemWaiter(t, ctx, rdb, c, s, n, 1, 1)

	require.NoError(t, p.Release(ctx))
	q1 := servedWithin(t, got1, 2*time.Second, "the first waiter was not handed the permit")
	// It holds with sem_pass still held back by the gate: no round trip
	// came before it, and no release went to Redis.
	assert.Zero(t, releases.n.Load(), "the permit went back to Redis")
	assert.Equal(t, dlock.PermitGrant(p), dlock.PermitGrant(q1), "the new Permit holds on another grant")
	require.Eventually(t, func() bool { return gate.n.Load() == 1 }, 2*time.Second, time.Millisecond)

	// Its Token, and its Release, wait for sem_pass's reply.
	tok := make(chan uint64, 1)
	go func() { tok <- q1.Token() }()
	rel := make(chan error, 1)
	go func() { rel <- q1.Release(ctx) }()
	select {
	case v := <-tok:
		t.Fatalf("Token returned %d before its token was issued", v)
	case err := <-rel:
		t.Fatalf("Release returned (%v) before the Permit's token was issued", err)
	case <-time.After(50 * time.Millisecond):
	}
	assert.Equal(t, []string{dlock.PermitGrant(p)}, rdb.ZRange(ctx, key(n)+":h", 0, -1).Val())
	gate.Open()
	tok1 := <-tok
	assert.Greater(t, tok1, p.Token(), "the handed Permit's token is not above its predecessor's")
	require.NoError(t, <-rel)
	q2 := servedWithin(t, got2, 2*time.Second, "the second waiter was not handed the permit")
	assert.Equal(t, dlock.PermitGrant(p), dlock.PermitGrant(q2))
	assert.Greater(t, q2.Token(), tok1)
	assert.Equal(t, triedBefore, tries.n.Load(), "the local waiter tried in Redis")
	assert.Zero(t, releases.n.Load(), "the permit went back to Redis")
	assert.Zero(t, rdb.ZCard(ctx, key(n)+":q").Val(), "the first waiter's place is still queued")

	require.NoError(t, q2.Release(ctx))
	assert.Positive(t, releases.n.Load())
	assert.Zero(t, rdb.ZCard(ctx, key(n)+":h").Val())
	requireAvailable(t, ctx, s, 1)
	require.ErrorIs(t, p.Release(ctx), dlock.ErrNotHeld, "a second Release of the handed-on Permit")
}

func TestSemaphoreCohort_Off_ReleaseGoesToRedis(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 20*time.Second)
	releases := &scriptCalls{s: scripts.SemRelease}
	rdb := e.rdb(releases)
	c := e.client(rdb)
	s := c.Semaphore(n, dlock.WithoutPermitCohort())
	require.NoError(t, s.SetPermits(ctx, 1))
	p, err := s.Acquire(ctx, 1)
	require.NoError(t, err)
	got := queuedSemWaiter(t, ctx, rdb, c, s, n, 1, 1)
	require.NoError(t, p.Release(ctx))
	q := servedWithin(t, got, 2*time.Second, "the waiter was not served")
	assert.EqualValues(t, 1, releases.n.Load())
	assert.NotEqual(t, dlock.PermitGrant(p), dlock.PermitGrant(q))
	require.NoError(t, q.Release(ctx))
}

// localSemWaiter starts an Acquire of n permits on s and returns once it
// waits in c's registry (the (local+1)th there) without a place in Redis
// (queued there still: the others'): it waits for a local handoff of a
// running permit cohort.
func localSemWaiter(t *testing.T, ctx context.Context, rdb *redis.Client, c *dlock.Client, s *dlock.Semaphore, name string, n, local int) <-chan *dlock.Permit {
	t.Helper()
	got := make(chan *dlock.Permit, 1)
	go func() {
		p, err := s.Acquire(ctx, n)
		assert.NoError(t, err)
		got <- p
	}()
	require.Eventually(t, func() bool { return dlock.LocalWaiters(c) == local+1 }, 5*time.Second, time.Millisecond)
	queued := rdb.ZCard(ctx, key(name)+":q").Val()
	time.Sleep(20 * time.Millisecond)
	require.Equal(t, queued, rdb.ZCard(ctx, key(name)+":q").Val(), "an Acquire queued in Redis while a permit cohort of its Client runs")
	return got
}

// requireAvailable fails the test unless s has want permits free now.
func requireAvailable(t *testing.T, ctx context.Context, s *dlock.Semaphore, want int) {
	t.Helper()
	avail, err := s.Available(ctx)
	require.NoError(t, err)
	assert.Equal(t, want, avail)
}

// availableSoon fails the test unless s has want permits free within 2 s.
func availableSoon(t *testing.T, ctx context.Context, s *dlock.Semaphore, want int, what string) {
	t.Helper()
	require.Eventually(t, func() bool {
		avail, err := s.Available(ctx)
		return err == nil && avail == want
	}, 2*time.Second, 10*time.Millisecond, what)
}

// semHold is one hold of the exclusion test: when its Acquire was called,
// when its Release returned, its token and its Redis grant.
type semHold struct {
	called, released time.Time
	token            uint64
	grant            string
}

func TestSemaphoreCohort_PermitsNeverAboveTotal_TokensFollowReleases_AcrossClients(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 60*time.Second)
	const total, clients, workers, rounds = 2, 4, 4, 30
	rdb := e.rdb()
	var holders, most atomic.Int64
	var mu sync.Mutex
	var holds []semHold
	var wg sync.WaitGroup
	for ci := range clients {
		s := e.client(e.rdb()).Semaphore(n)
		if ci == 0 {
			require.NoError(t, s.SetPermits(ctx, total))
		}
		for range workers {
			wg.Go(func() {
				for range rounds {
					called := time.Now()
					p, err := s.Acquire(ctx, 1)
					if !assert.NoError(t, err) {
						return
					}
					h := holders.Add(1)
					for m := most.Load(); h > m && !most.CompareAndSwap(m, h); m = most.Load() {
					}
					time.Sleep(300 * time.Microsecond)
					tok := p.Token()
					holders.Add(-1)
					assert.NoError(t, p.Release(ctx))
					mu.Lock()
					holds = append(holds, semHold{called: called, released: time.Now(), token: tok, grant: dlock.PermitGrant(p)})
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	require.Len(t, holds, clients*workers*rounds)
	assert.LessOrEqual(t, most.Load(), int64(total), "more holders than permits")

	grants := map[string]int{}
	seen := map[uint64]bool{}
	for _, h := range holds {
		require.NotZero(t, h.token)
		require.False(t, seen[h.token], "token %d issued twice", h.token)
		seen[h.token] = true
		grants[h.grant]++
	}
	// A hold whose Acquire was called after another's Release returned
	// has the higher token.
	byRelease := append([]semHold(nil), holds...)
	sort.Slice(byRelease, func(i, j int) bool { return byRelease[i].released.Before(byRelease[j].released) })
	var highest uint64
	k := 0
	byCall := append([]semHold(nil), holds...)
	sort.Slice(byCall, func(i, j int) bool { return byCall[i].called.Before(byCall[j].called) })
	for _, h := range byCall {
		for ; k < len(byRelease) && byRelease[k].released.Before(h.called); k++ {
			highest = max(highest, byRelease[k].token)
		}
		require.Greater(t, h.token, highest, "a hold called after a release has a lower token")
	}
	local := len(holds) - len(grants)
	t.Logf("%d holds on %d Redis grants: %d handed on locally", len(holds), len(grants), local)
	assert.Positive(t, local, "no permit was handed on locally")

	require.Eventually(t, func() bool {
		return rdb.ZCard(ctx, key(n)+":h").Val() == 0 && rdb.ZCard(ctx, key(n)+":q").Val() == 0
	}, 5*time.Second, 5*time.Millisecond, "permits or places left in Redis")
	requireAvailable(t, ctx, e.client(rdb).Semaphore(n), total)
}

// A release elsewhere grants the waiter's place its permits while its own
// Client hands it a Permit: it takes one, and the other goes back.
func TestSemaphoreCohort_RedisGrantAndLocalHandoffRace_NoPermitLeaks(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 60*time.Second)
	rdb := e.rdb()
	ca, cb := e.client(e.rdb()), e.client(e.rdb())
	// The waiter's handle waits for a local handoff for 20 ms only, then
	// queues in Redis; the holder's hands on for a minute.
	sa, sw, sb := ca.Semaphore(n, dlock.WithPermitCohort(0, time.Minute)), ca.Semaphore(n, dlock.WithPermitCohort(0, 20*time.Millisecond)), cb.Semaphore(n)
	require.NoError(t, sa.SetPermits(ctx, 2))
	for i := range 10 {
		pa, err := sa.Acquire(ctx, 1)
		require.NoError(t, err)
		pb, err := sb.Acquire(ctx, 1)
		require.NoError(t, err)
		got := queuedSemWaiter(t, ctx, rdb, ca, sw, n, 1, 1)
		var wg sync.WaitGroup
		wg.Go(func() { assert.NoError(t, pb.Release(ctx)) })
		wg.Go(func() { assert.NoError(t, pa.Release(ctx)) })
		wg.Wait()
		q := servedWithin(t, got, 5*time.Second, "the waiter was not served")
		require.NoError(t, q.Release(ctx), "round %d", i)
		require.Eventually(t, func() bool {
			avail, err := sa.Available(ctx)
			return err == nil && avail == 2 && rdb.ZCard(ctx, key(n)+":h").Val() == 0
		}, 5*time.Second, 5*time.Millisecond, "round %d: a permit is left taken", i)
	}
}

// The waiter's place is granted in Redis after its Client handed it a
// Permit, before sem_pass took the place out: sem_pass gives that grant
// back, and the permits serve others at once.
func TestSemaphoreCohort_PlaceGrantedAfterTheHandoff_GivenBackBySemPass(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 20*time.Second)
	gate := newScriptGate(t, scripts.SemPass)
	rdb := e.rdb(gate)
	ca, cb := e.client(rdb), e.client(e.rdb())
	// The waiter's handle waits for a local handoff for 20 ms only, then
	// queues in Redis; the holder's hands on for a minute.
	sa, sw, sb := ca.Semaphore(n, dlock.WithPermitCohort(0, time.Minute)), ca.Semaphore(n, dlock.WithPermitCohort(0, 20*time.Millisecond)), cb.Semaphore(n)
	require.NoError(t, sa.SetPermits(ctx, 2))
	pa, err := sa.Acquire(ctx, 1)
	require.NoError(t, err)
	pb, err := sb.Acquire(ctx, 1)
	require.NoError(t, err)
	got := queuedSemWaiter(t, ctx, rdb, ca, sw, n, 1, 1)
	require.NoError(t, pa.Release(ctx))
	q := servedWithin(t, got, 2*time.Second, "the waiter was not handed the permit")
	// sem_pass is held back: the place is still queued, and B's release
	// grants it the permit B gives back.
	require.NoError(t, pb.Release(ctx))
	require.EqualValues(t, 2, rdb.ZCard(ctx, key(n)+":h").Val(), "B's release did not grant the waiter's place")
	gate.Open()
	require.NotZero(t, q.Token())
	require.Eventually(t, func() bool { return rdb.ZCard(ctx, key(n)+":h").Val() == 1 }, 2*time.Second, time.Millisecond,
		"the place's grant was not given back")
	requireAvailable(t, ctx, sa, 1)
	require.NoError(t, q.Release(ctx))
	requireAvailable(t, ctx, sa, 2)
}

// An Acquire handed a Permit as its ctx ends gives it back (or takes it,
// and its Release does).
func TestSemaphoreCohort_WaiterGivesUpAsItIsHanded_PermitGoesBack(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 60*time.Second)
	rdb := e.rdb()
	c := e.client(rdb)
	s := c.Semaphore(n, dlock.WithPermitCohort(0, time.Minute))
	require.NoError(t, s.SetPermits(ctx, 1))
	gaveUp := 0
	for i := range 20 {
		p, err := s.Acquire(ctx, 1)
		require.NoError(t, err)
		wctx, cancel := context.WithCancel(ctx)
		res := make(chan error, 1)
		go func() {
			q, err := s.Acquire(wctx, 1)
			if err == nil {
				err = q.Release(ctx)
			}
			res <- err
		}()
		require.Eventually(t, func() bool { return dlock.LocalWaiters(c) == 1 }, 5*time.Second, time.Millisecond)
		if i%2 == 0 {
			cancel()
			require.NoError(t, p.Release(ctx))
		} else {
			require.NoError(t, p.Release(ctx))
			cancel()
		}
		if err := <-res; err != nil {
			require.ErrorIs(t, err, dlock.ErrNotObtained)
			gaveUp++
		}
		require.Eventually(t, func() bool {
			avail, err := s.Available(ctx)
			return err == nil && avail == 1 && rdb.ZCard(ctx, key(n)+":q").Val() == 0
		}, 5*time.Second, 5*time.Millisecond, "round %d: the permit is left taken", i)
	}
	t.Logf("%d of 20 waiters gave up", gaveUp)
}

// A Permit handed on whose permits turned out gone from Redis is lost, with
// no token.
func TestSemaphoreCohort_HandedPermitGoneFromRedis_LostWithoutAToken(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 20*time.Second)
	gate := newScriptGate(t, scripts.SemPass)
	rdb := e.rdb(gate)
	c := e.client(rdb)
	s, p := allPermitsHeld(t, ctx, c, n, 1, dlock.WithPermitCohort(0, time.Minute))
	got := queuedSemWaiter(t, ctx, rdb, c, s, n, 1, 1)
	// The permit's lease runs out on the server, unknown to its holder.
	require.NoError(t, rdb.ZAdd(ctx, key(n)+":h", redis.Z{Score: 1, Member: dlock.PermitGrant(p)}).Err())
	require.NoError(t, p.Release(ctx))
	q := servedWithin(t, got, 2*time.Second, "the waiter was not handed the permit")
	gate.Open()
	within(t, q.Lost(), 2*time.Second, "the handed Permit's loss")
	assert.Zero(t, q.Token())
	require.ErrorIs(t, q.Release(ctx), dlock.ErrLost)
	requireAvailable(t, ctx, s, 1)
}

func TestSemaphoreCohort_CloseLeaksNothing(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 20*time.Second)
	ignore := goleak.IgnoreCurrent()
	c := dlock.New(e.rdb())
	s := c.Semaphore(n)
	require.NoError(t, s.SetPermits(ctx, 1))
	var wg sync.WaitGroup
	var holds atomic.Int64
	for range 4 {
		wg.Go(func() {
			for {
				p, err := s.Acquire(ctx, 1)
				if err != nil {
					if !errors.Is(err, dlock.ErrClosed) {
						t.Error(err)
					}
					return
				}
				holds.Add(1)
				time.Sleep(200 * time.Microsecond)
				_ = p.Token()
				if err := p.Release(ctx); err != nil && !errors.Is(err, dlock.ErrClosed) && !errors.Is(err, dlock.ErrLost) {
					t.Error(err)
				}
			}
		})
	}
	time.Sleep(100 * time.Millisecond)
	require.NoError(t, c.Close())
	wg.Wait()
	require.Positive(t, holds.Load())
	goleak.VerifyNone(t, ignore,
		goleak.IgnoreAnyFunction("github.com/alicebob/miniredis/v2/server.(*Server).servePeer"),
		goleak.IgnoreAnyFunction("github.com/alicebob/miniredis/v2/server.(*Server).servePeer.func2"))
}

// A partitioned Client hands a Permit on locally (no round trip, so the
// partition does not stop it): the new holder's hold ends with the Redis
// lease it inherited, and it learns of its loss before an Acquire on
// another Client holds the permit. Its token never comes (0).
func TestFault_SemaphoreCohort_PartitionedLocalHandoff_HolderToldBeforeAnotherClientHolds(t *testing.T) {
	long(t)
	e := realEnv(t)
	const timeout = time.Second
	ctx := ctxTimeout(t, 20*time.Second)
	n := name(t)
	rdb, proxy := e.proxied()
	c := dlock.New(rdb, dlock.WithWatchdogTimeout(timeout))
	defer c.Close()
	other := e.client(e.rdb(), dlock.WithWatchdogTimeout(timeout))
	s := c.Semaphore(n, dlock.WithPermitCohort(4, time.Minute))
	require.NoError(t, s.SetPermits(ctx, 1))
	granted := time.Now()
	p, err := s.Acquire(ctx, 1)
	require.NoError(t, err)
	got := queuedSemWaiter(t, ctx, e.rdb(), c, s, n, 1, 1)
	// Well into the lease, before its first renewal (a third of the
	// timeout): a handoff that gave the new holder a lease of its own would
	// outlive the one in Redis by this much.
	time.Sleep(time.Until(granted.Add(timeout / 4)))

	proxy.Partition()
	start := time.Now()
	require.NoError(t, p.Release(ctx), "a local handoff sends nothing")
	q := servedWithin(t, got, time.Second, "the waiter was not handed the permit")
	hctx, stop := q.HoldContext(ctx)
	defer stop()
	told := endedAt(hctx)

	r, err := other.Semaphore(n).Acquire(ctx, 1)
	require.NoError(t, err)
	held := time.Now()
	knew := told()
	require.False(t, knew.IsZero(), "the new holder was not told of its loss by the time another Client held")
	t.Logf("partition at 0; the handed Permit's holder told at %v; the other Client held at %v",
		knew.Sub(start).Round(time.Millisecond), held.Sub(start).Round(time.Millisecond))
	assert.True(t, knew.Before(held))
	assert.ErrorIs(t, context.Cause(hctx), dlock.ErrLost)
	assert.Zero(t, q.Token(), "a token issued through the partition")

	proxy.Heal()
	assert.ErrorIs(t, q.Release(ctx), dlock.ErrLost)
	assert.Greater(t, r.Token(), p.Token())
	require.NoError(t, r.Release(ctx))
}

// A permit cohort that ends (here after one local handoff) queues the
// Acquires of its Client that waited for a handoff, in their order, in its
// release's own script: the first is granted the permit at once, and the
// releaser's next Acquire comes after them all.
func TestSemaphoreCohort_CohortEnds_ItsLocalWaitersQueuedInOrder_AheadOfTheReleaser(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 20*time.Second)
	rdb := e.rdb()
	c := e.client(rdb)
	s := c.Semaphore(n, dlock.WithPermitCohort(1, time.Minute))
	require.NoError(t, s.SetPermits(ctx, 1))
	p, err := s.Acquire(ctx, 1)
	require.NoError(t, err)
	var order []int
	var mu sync.Mutex
	var wg sync.WaitGroup
	got := make([]chan *dlock.Permit, 4)
	for i := range 3 {
		got[i] = make(chan *dlock.Permit, 1)
		wg.Go(func() {
			q, err := s.Acquire(ctx, 1)
			if !assert.NoError(t, err) {
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			got[i] <- q
		})
		require.Eventually(t, func() bool { return dlock.LocalWaiters(c) == i+1 }, 5*time.Second, time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	// Waiter 0 queued in Redis; 1 and 2, behind another of their Client,
	// wait for a handoff.
	require.EqualValues(t, 1, rdb.ZCard(ctx, key(n)+":q").Val(), "an Acquire queued in Redis while the cohort runs")

	require.NoError(t, p.Release(ctx)) // to waiter 0, locally: the cohort's one handoff
	q0 := servedWithin(t, got[0], 2*time.Second, "waiter 0 was not handed the permit")
	require.Equal(t, dlock.PermitGrant(p), dlock.PermitGrant(q0))
	require.NoError(t, q0.Release(ctx)) // the cohort ends: 1 and 2 queue, 1 is granted
	q1 := servedWithin(t, got[1], 2*time.Second, "waiter 1 was not served when the cohort ended")
	assert.NotEqual(t, dlock.PermitGrant(p), dlock.PermitGrant(q1))
	// The releaser asks again: behind waiter 2.
	got[3] = make(chan *dlock.Permit, 1)
	wg.Go(func() {
		q, err := s.Acquire(ctx, 1)
		if !assert.NoError(t, err) {
			return
		}
		mu.Lock()
		order = append(order, 3)
		mu.Unlock()
		got[3] <- q
	})
	require.Eventually(t, func() bool { return dlock.LocalWaiters(c) == 2 }, 5*time.Second, time.Millisecond)
	// (q1's grant came from Redis: a cohort of its own, whose handoff the
	// releaser's Acquire waits for, behind waiter 2.)
	require.NoError(t, q1.Release(ctx))
	q2 := servedWithin(t, got[2], 2*time.Second, "waiter 2 was not served")
	require.NoError(t, q2.Release(ctx))
	q3 := servedWithin(t, got[3], 2*time.Second, "the releaser's next Acquire was not served")
	wg.Wait()
	assert.Equal(t, []int{0, 1, 2, 3}, order)
	assert.Less(t, p.Token(), q0.Token())
	assert.Less(t, q0.Token(), q1.Token())
	assert.Less(t, q1.Token(), q2.Token())
	assert.Less(t, q2.Token(), q3.Token())
	require.NoError(t, q3.Release(ctx))
	require.Eventually(t, func() bool {
		return rdb.ZCard(ctx, key(n)+":h").Val() == 0 && rdb.ZCard(ctx, key(n)+":q").Val() == 0
	}, 2*time.Second, time.Millisecond, "permits or places left in Redis")
}

// An Acquire on a handle WithPermitLease (a fixed lease, never renewed) is
// never handed a Permit locally: a renewed one would never run out.
func TestSemaphoreCohort_FixedLeaseWaiter_NotHandedARenewedPermit(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 20*time.Second)
	rdb := e.rdb()
	c := e.client(rdb)
	renewed := c.Semaphore(n, dlock.WithPermitCohort(0, time.Minute))
	fixed := c.Semaphore(n, dlock.WithPermitLease(500*time.Millisecond))
	require.NoError(t, renewed.SetPermits(ctx, 1))
	p, err := renewed.Acquire(ctx, 1)
	require.NoError(t, err)
	got := queuedSemWaiter(t, ctx, rdb, c, fixed, n, 1, 1)
	require.NoError(t, p.Release(ctx))
	q := servedWithin(t, got, 2*time.Second, "the fixed-lease waiter was not served")
	assert.NotEqual(t, dlock.PermitGrant(p), dlock.PermitGrant(q), "handed the renewed Permit locally")
	within(t, q.Lost(), 2*time.Second, "the fixed lease's end")
	// (Lost fires a little before the lease ends on the server's clock.)
	availableSoon(t, ctx, fixed, 1, "the fixed-lease permit is still taken after its lease")
}

// dialGate fails every dial while armed, after holding the first until
// released.
type dialGate struct {
	armed   atomic.Bool
	dialing chan struct{}
	release chan struct{}
	once    sync.Once
}

func (g *dialGate) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if g.armed.Load() {
			g.once.Do(func() { close(g.dialing); <-g.release })
			return nil, errors.New("dial refused (test)")
		}
		return next(ctx, network, addr)
	}
}
func (g *dialGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (g *dialGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A Permit handed to an Acquire while it subscribes, a subscription that
// then fails, is given back (it was once renewed, held by nobody, until the
// Client closed).
func TestSemaphoreCohort_HandedWhileTheSubscriptionFails_GivenBack(t *testing.T) {
	e := realEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 30*time.Second)
	g := &dialGate{dialing: make(chan struct{}), release: make(chan struct{})}
	rdb := e.rdb(g)
	c := e.client(rdb) // (a 30 s lease: a Permit nobody gives back stays taken)
	s := c.Semaphore(n, dlock.WithPermitCohort(0, time.Minute))
	require.NoError(t, s.SetPermits(ctx, 1))
	p, err := s.Acquire(ctx, 1)
	require.NoError(t, err)
	// Idle connections in the pool, then dials fail: the first is the
	// pub/sub connection's.
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() { _ = rdb.Do(ctx, "DEBUG", "SLEEP", "0.05").Err() })
	}
	wg.Wait()
	g.armed.Store(true)
	res := make(chan error, 1)
	go func() {
		q, err := s.Acquire(ctx, 1)
		if err == nil {
			err = q.Release(ctx)
		}
		res <- err
	}()
	<-g.dialing // the waiter is in the registry, and subscribes
	require.NoError(t, p.Release(ctx))
	close(g.release)
	err = <-res
	g.armed.Store(false)
	require.Error(t, err, "the Acquire whose subscription failed")
	availableSoon(t, ctx, s, 1, "the Permit handed to the failed Acquire is still taken")
}

// The release that ends a permit cohort queues the cohort's local waiters
// one round trip after it took them from the registry. Meanwhile they must
// not try on their own: a try granted free permits, and then queued again
// by the release, would count the permits twice (used forever).
func TestSemaphoreCohort_EndedCohortsWaiter_DoesNotTryBeforeTheReleaseQueuesIt(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 20*time.Second)
	gate := newScriptGate(t, scripts.SemRelease)
	rdb := e.rdb(gate)
	c, d := e.client(rdb), e.client(e.rdb())
	sa := c.Semaphore(n, dlock.WithPermitCohort(4, 300*time.Millisecond))
	sw := c.Semaphore(n, dlock.WithPermitCohort(4, 600*time.Millisecond))
	require.NoError(t, sa.SetPermits(ctx, 3))
	granted := time.Now()
	p, err := sa.Acquire(ctx, 1)
	require.NoError(t, err)
	sd := d.Semaphore(n)
	p2, err := sd.Acquire(ctx, 1)
	require.NoError(t, err)
	p3, err := sd.Acquire(ctx, 1)
	require.NoError(t, err)
	// The first Acquire of c queues in Redis; the second waits for p's
	// cohort locally.
	gotA := queuedSemWaiter(t, ctx, rdb, c, sa, n, 1, 1)
	got := make(chan *dlock.Permit, 1)
	go func() {
		q, err := sw.Acquire(ctx, 1)
		assert.NoError(t, err)
		got <- q
	}()
	require.Eventually(t, func() bool { return dlock.LocalWaiters(c) == 2 }, 5*time.Second, time.Millisecond)
	require.EqualValues(t, 1, rdb.ZCard(ctx, key(n)+":q").Val(), "the second Acquire queued in Redis")
	time.Sleep(time.Until(granted.Add(350 * time.Millisecond))) // p's cohort is past its 300 ms; the waiter's 600 ms are not over
	rel := make(chan error, 1)
	go func() { rel <- p.Release(ctx) }() // ends the cohort; its sem_release is held
	require.Eventually(t, func() bool { return gate.n.Load() == 1 }, 5*time.Second, time.Millisecond)
	// Another Client's releases serve the queued Acquire and free a
	// permit, while the local waiter's time bound runs out.
	require.NoError(t, p2.Release(ctx))
	a := servedWithin(t, gotA, 2*time.Second, "the queued Acquire was not served")
	require.NoError(t, p3.Release(ctx))
	time.Sleep(400 * time.Millisecond) // the waiter's time bound runs out: it tries
	gate.Open()
	q := servedWithin(t, got, 2*time.Second, "the waiter was not served")
	require.NoError(t, <-rel)
	require.NoError(t, q.Release(ctx))
	require.NoError(t, a.Release(ctx))
	availableSoon(t, ctx, sd, 3, "permits counted as used with nothing held")
}

// An Acquire that waits for the release ending a cohort to queue it still
// ends with its ctx.
func TestSemaphoreCohort_EndedCohortsWaiter_CtxEndsItsWait(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 20*time.Second)
	gate := newScriptGate(t, scripts.SemRelease)
	rdb := e.rdb(gate)
	c := e.client(rdb)
	sa := c.Semaphore(n, dlock.WithPermitCohort(4, 50*time.Millisecond))
	sw := c.Semaphore(n, dlock.WithPermitCohort(4, 300*time.Millisecond))
	require.NoError(t, sa.SetPermits(ctx, 1))
	p, err := sa.Acquire(ctx, 1)
	require.NoError(t, err)
	actx, cancelA := context.WithCancel(ctx)
	doneA := make(chan struct{})
	go func() {
		defer close(doneA)
		a, err := sa.Acquire(actx, 1) // served when p's release runs, or given up
		if err == nil {
			assert.NoError(t, a.Release(ctx))
			return
		}
		assert.ErrorIs(t, err, dlock.ErrNotObtained)
	}()
	require.Eventually(t, func() bool { return rdb.ZCard(ctx, key(n)+":q").Val() == 1 }, 5*time.Second, time.Millisecond)
	wctx, cancelW := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := sw.Acquire(wctx, 1)
		done <- err
	}()
	require.Eventually(t, func() bool { return dlock.LocalWaiters(c) == 2 }, 5*time.Second, time.Millisecond)
	time.Sleep(100 * time.Millisecond)
	rel := make(chan error, 1)
	go func() { rel <- p.Release(ctx) }()
	require.Eventually(t, func() bool { return gate.n.Load() == 1 }, 5*time.Second, time.Millisecond)
	time.Sleep(300 * time.Millisecond) // its time bound runs out: it tries, and waits for the reply
	cancelW()
	select {
	case err := <-done:
		require.ErrorIs(t, err, dlock.ErrNotObtained)
	case <-time.After(time.Second):
		t.Fatal("the Acquire did not end with its ctx")
	}
	gate.Open()
	require.NoError(t, <-rel)
	cancelA()
	<-doneA
	require.Eventually(t, func() bool {
		avail, err := sa.Available(ctx)
		return err == nil && avail == 1 && rdb.ZCard(ctx, key(n)+":q").Val() == 0
	}, 2*time.Second, 10*time.Millisecond, "a permit or place left behind")
}

// A Permit's lease may change (Extend) while another goroutine's Acquire
// asks whether its cohort runs (run with -race).
func TestSemaphoreCohort_ExtendBesideAnAcquire_NoRace(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 20*time.Second)
	c := e.client(e.rdb())
	s, p := allPermitsHeld(t, ctx, c, n, 1, dlock.WithPermitCohort(0, time.Minute))
	w, cancelW := context.WithCancel(ctx)
	wdone := make(chan struct{})
	go func() { defer close(wdone); _, _ = s.Acquire(w, 1) }()
	require.Eventually(t, func() bool { return dlock.LocalWaiters(c) == 1 }, 5*time.Second, time.Millisecond)
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range 20 {
			assert.NoError(t, p.Extend(ctx, time.Duration(10+i)*time.Second))
		}
	})
	wg.Go(func() {
		for range 20 {
			a, cancel := context.WithTimeout(ctx, 5*time.Millisecond)
			_, err := s.Acquire(a, 1)
			assert.ErrorIs(t, err, dlock.ErrNotObtained)
			cancel()
		}
	})
	wg.Wait()
	cancelW()
	<-wdone
	require.NoError(t, p.Release(ctx))
}

// A request for more than the total waits, holding nobody back: it does not
// make another Acquire of its Client wait for a cohort with a permit free.
func TestSemaphoreCohort_PermitFreeBesideABigRequest_AcquireDoesNotWait(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 20*time.Second)
	c := e.client(e.rdb())
	s := c.Semaphore(n, dlock.WithPermitCohort(4, 2*time.Second))
	require.NoError(t, s.SetPermits(ctx, 2))
	p, err := s.Acquire(ctx, 1)
	require.NoError(t, err)
	big, cancelBig := context.WithCancel(ctx)
	bigDone := make(chan struct{})
	go func() { defer close(bigDone); _, _ = s.Acquire(big, 3) }()
	require.Eventually(t, func() bool { return dlock.LocalWaiters(c) == 1 }, 5*time.Second, time.Millisecond)
	start := time.Now()
	q, err := s.Acquire(ctx, 1)
	require.NoError(t, err)
	assert.Less(t, time.Since(start), 500*time.Millisecond, "an Acquire waited with a permit free")
	require.NoError(t, q.Release(ctx))
	require.NoError(t, p.Release(ctx))
	cancelBig()
	<-bigDone
}

// With permits free, an Acquire on a Client whose Permit runs a cohort
// takes one at once rather than wait for the cohort's handoff.
func TestSemaphoreCohort_PermitsFree_AcquireDoesNotWaitForTheCohort(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 20*time.Second)
	c := e.client(e.rdb())
	s := c.Semaphore(n, dlock.WithPermitCohort(4, 2*time.Second))
	require.NoError(t, s.SetPermits(ctx, 10))
	p, err := s.Acquire(ctx, 1)
	require.NoError(t, err)
	start := time.Now()
	q, err := s.Acquire(ctx, 1)
	require.NoError(t, err)
	assert.Less(t, time.Since(start), 500*time.Millisecond, "an Acquire waited while 9 permits were free")
	assert.NotEqual(t, dlock.PermitGrant(p), dlock.PermitGrant(q))
	require.NoError(t, q.Release(ctx))
	require.NoError(t, p.Release(ctx))
}

// A handed Permit turns out lost (its grant gone from Redis), and its
// holder releases it: the cohort's other local waiter tries at once, rather
// than wait out its handle's time bound (a minute here) with the permit
// free.
func TestSemaphoreCohort_LostCohortPermitReleased_ItsLocalWaiterTries(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 20*time.Second)
	rdb := e.rdb()
	c := e.client(rdb)
	s, p := allPermitsHeld(t, ctx, c, n, 1, dlock.WithPermitCohort(0, time.Minute))
	got1 := queuedSemWaiter(t, ctx, rdb, c, s, n, 1, 1)
	got2 := localSemWaiter(t, ctx, rdb, c, s, n, 1, 1)
	require.NoError(t, rdb.ZAdd(ctx, key(n)+":h", redis.Z{Score: 1, Member: dlock.PermitGrant(p)}).Err())
	require.NoError(t, p.Release(ctx)) // to waiter 1, which its token's script finds lost
	q := servedWithin(t, got1, 2*time.Second, "waiter 1 was not handed the permit")
	within(t, q.Lost(), 2*time.Second, "the handed Permit's loss")
	require.ErrorIs(t, q.Release(ctx), dlock.ErrLost)
	r := servedWithin(t, got2, 3*time.Second, "waiter 2 still waits locally, with the permit free")
	require.NoError(t, r.Release(ctx))
}

// The total lowered below the permits in use (a request is then for more
// than the total, and waits for it to be raised), or the semaphore deleted
// (a request waits for a total to be set), by the Client that runs the
// cohort: its Permit goes back to Redis rather than to the waiter.
func TestSemaphoreCohort_TotalLoweredOrDeleted_PermitNotHandedOn(t *testing.T) {
	for _, deleted := range []bool{false, true} {
		t.Run(fmt.Sprintf("deleted %v", deleted), func(t *testing.T) {
			e := sharedEnv(t)
			n := name(t)
			ctx := ctxTimeout(t, 20*time.Second)
			rdb := e.rdb()
			c := e.client(rdb)
			s, p := allPermitsHeld(t, ctx, c, n, 1, dlock.WithPermitCohort(0, time.Minute))
			got := queuedSemWaiter(t, ctx, rdb, c, s, n, 1, 1)
			if deleted {
				ok, err := s.Delete(ctx)
				require.NoError(t, err)
				require.True(t, ok)
				require.ErrorIs(t, p.Release(ctx), dlock.ErrNotHeld)
			} else {
				require.NoError(t, s.AddPermits(ctx, -1)) // total 0
				require.NoError(t, p.Release(ctx))
			}
			select {
			case q := <-got:
				t.Fatalf("Acquire(1) returned a Permit (token %d) with no total to allow it", q.Token())
			case <-time.After(300 * time.Millisecond):
			}
			if deleted {
				require.NoError(t, s.SetPermits(ctx, 1))
			} else {
				availableSoon(t, ctx, s, 0, "the permit is still taken")
				require.NoError(t, s.AddPermits(ctx, 1))
			}
			q := servedWithin(t, got, 2*time.Second, "the waiter was not served once the total allowed it")
			require.NoError(t, q.Release(ctx))
		})
	}
}

// failOnce is a go-redis hook that fails the first call of a script with a
// connection error, the script not sent.
type failOnce struct {
	s *redis.Script
	n atomic.Int64
}

func (g *failOnce) DialHook(next redis.DialHook) redis.DialHook { return next }
func (g *failOnce) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (g *failOnce) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isScript(cmd, g.s) && g.n.Add(1) == 1 {
			err := &net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset (test)")}
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

// sem_pass fails: the served Acquire's place, which it would have taken out,
// goes all the same, rather than be granted permits nobody takes.
func TestSemaphoreCohort_SemPassFails_ThePlaceStillGoes(t *testing.T) {
	e := sharedEnv(t)
	n := name(t)
	ctx := ctxTimeout(t, 30*time.Second)
	rdb := e.rdb(&failOnce{s: scripts.SemPass})
	ca, cb := e.client(rdb), e.client(e.rdb())
	sa, sb := ca.Semaphore(n, dlock.WithPermitCohort(0, time.Minute)), cb.Semaphore(n)
	require.NoError(t, sa.SetPermits(ctx, 2))
	pa, err := sa.Acquire(ctx, 1)
	require.NoError(t, err)
	pb, err := sb.Acquire(ctx, 1)
	require.NoError(t, err)
	got := queuedSemWaiter(t, ctx, rdb, ca, sa, n, 1, 1)
	require.NoError(t, pa.Release(ctx))
	q := servedWithin(t, got, 2*time.Second, "the waiter was not handed the permit")
	require.Zero(t, q.Token(), "a token from a failed sem_pass")
	require.NoError(t, pb.Release(ctx))
	availableSoon(t, ctx, sa, 1, "a permit is taken by the served Acquire's place")
	require.NoError(t, q.Release(ctx))
	availableSoon(t, ctx, sa, 2, "permits left taken")
}
