package dlock_test

import (
	"context"
	"errors"
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
	s, p := cohortPermitHeld(t, ctx, c, n)
	triedBefore := tries.n.Load()
	got := localSemWaiter(t, ctx, rdb, c, s, n, 1, 0)

	require.NoError(t, p.Release(ctx))
	q := servedWithin(t, got, 2*time.Second, "the waiter of the releasing Client was not handed the permit")
	// It holds with sem_pass still held back by the gate: it sent nothing
	// (it waited for the handoff, with no place in Redis), and no release
	// went to Redis.
	assert.Zero(t, releases.n.Load(), "the permit went back to Redis")
	assert.Equal(t, triedBefore, tries.n.Load(), "the waiter tried in Redis")
	assert.Equal(t, dlock.PermitGrant(p), dlock.PermitGrant(q), "the new Permit holds on another grant")
	require.Eventually(t, func() bool { return gate.n.Load() == 1 }, 2*time.Second, time.Millisecond)

	// Its Token, and its Release, wait for sem_pass's reply.
	tok := make(chan uint64, 1)
	go func() { tok <- q.Token() }()
	rel := make(chan error, 1)
	go func() { rel <- q.Release(ctx) }()
	select {
	case v := <-tok:
		t.Fatalf("Token returned %d before its token was issued", v)
	case err := <-rel:
		t.Fatalf("Release returned (%v) before the Permit's token was issued", err)
	case <-time.After(50 * time.Millisecond):
	}
	assert.Equal(t, []string{dlock.PermitGrant(p)}, rdb.ZRange(ctx, key(n)+":h", 0, -1).Val())
	gate.Open()
	assert.Greater(t, <-tok, p.Token(), "the handed Permit's token is not above its predecessor's")
	require.NoError(t, <-rel)
	assert.Positive(t, releases.n.Load())
	assert.Zero(t, rdb.ZCard(ctx, key(n)+":q").Val(), "the served waiter's place is still queued")
	assert.Zero(t, rdb.ZCard(ctx, key(n)+":h").Val())
	avail, err := s.Available(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, avail)
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
// waits in c's registry (the (local+1)th there) with no place in Redis: it
// waits for a local handoff of a running permit cohort.
func localSemWaiter(t *testing.T, ctx context.Context, rdb *redis.Client, c *dlock.Client, s *dlock.Semaphore, name string, n, local int) <-chan *dlock.Permit {
	t.Helper()
	got := make(chan *dlock.Permit, 1)
	go func() {
		p, err := s.Acquire(ctx, n)
		assert.NoError(t, err)
		got <- p
	}()
	require.Eventually(t, func() bool { return dlock.LocalWaiters(c) == local+1 }, 5*time.Second, time.Millisecond)
	time.Sleep(20 * time.Millisecond)
	require.Zero(t, rdb.ZCard(ctx, key(name)+":q").Val(), "an Acquire queued in Redis while a permit cohort of its Client runs")
	return got
}

// cohortPermitHeld sets semaphore n's total to 1 on c and takes the permit,
// through a handle whose cohort's time bound outlasts the test's waits.
func cohortPermitHeld(t *testing.T, ctx context.Context, c *dlock.Client, n string) (*dlock.Semaphore, *dlock.Permit) {
	t.Helper()
	s := c.Semaphore(n, dlock.WithPermitCohort(0, time.Minute))
	require.NoError(t, s.SetPermits(ctx, 1))
	p, err := s.Acquire(ctx, 1)
	require.NoError(t, err)
	return s, p
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
	avail, err := e.client(rdb).Semaphore(n).Available(ctx)
	require.NoError(t, err)
	assert.Equal(t, total, avail)
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
	avail, err := sa.Available(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, avail)
	require.NoError(t, q.Release(ctx))
	avail, err = sa.Available(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, avail)
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
	s, p := cohortPermitHeld(t, ctx, c, n)
	got := localSemWaiter(t, ctx, rdb, c, s, n, 1, 0)
	// The permit's lease runs out on the server, unknown to its holder.
	require.NoError(t, rdb.ZAdd(ctx, key(n)+":h", redis.Z{Score: 1, Member: dlock.PermitGrant(p)}).Err())
	require.NoError(t, p.Release(ctx))
	q := servedWithin(t, got, 2*time.Second, "the waiter was not handed the permit")
	gate.Open()
	within(t, q.Lost(), 2*time.Second, "the handed Permit's loss")
	assert.Zero(t, q.Token())
	require.ErrorIs(t, q.Release(ctx), dlock.ErrLost)
	avail, err := s.Available(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, avail)
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
	got := localSemWaiter(t, ctx, e.rdb(), c, s, n, 1, 0)
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
	require.Zero(t, rdb.ZCard(ctx, key(n)+":q").Val(), "an Acquire queued in Redis while the cohort runs")

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
