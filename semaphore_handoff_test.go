package dlock_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/scripts"
)

// allPermitsHeld sets semaphore n's total on c and takes every permit,
// through a handle with opts.
func allPermitsHeld(t *testing.T, ctx context.Context, c *dlock.Client, n string, total int, opts ...dlock.SemaphoreOption) (*dlock.Semaphore, *dlock.Permit) {
	t.Helper()
	s := c.Semaphore(n, opts...)
	require.NoError(t, s.SetPermits(ctx, total))
	p, err := s.Acquire(ctx, total)
	require.NoError(t, err)
	return s, p
}

// servedWithin returns the permit got delivers, failing the test as what
// when it takes longer than d.
func servedWithin(t *testing.T, got <-chan *dlock.Permit, d time.Duration, what string) *dlock.Permit {
	t.Helper()
	select {
	case q := <-got:
		require.NotNil(t, q)
		return q
	case <-time.After(d):
		t.Fatal(what)
		return nil
	}
}

// queuedSemWaiter starts an Acquire of n permits on s and returns once it is
// queued in Redis and waiting, its try after subscribing done.
func queuedSemWaiter(t *testing.T, ctx context.Context, rdb *redis.Client, c *dlock.Client, s *dlock.Semaphore, name string, n, queued int) <-chan *dlock.Permit {
	t.Helper()
	got := make(chan *dlock.Permit, 1)
	go func() {
		p, err := s.Acquire(ctx, n)
		assert.NoError(t, err)
		got <- p
	}()
	require.Eventually(t, func() bool { return rdb.ZCard(ctx, key(name)+":q").Val() == int64(queued) }, 5*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { return dlock.LocalWaiters(c) >= 1 }, 5*time.Second, time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	return got
}

// onlyPermitLeft returns what the lease of semaphore n's one permit has
// left, on the server's clock; the test fails unless exactly one is held.
func onlyPermitLeft(t *testing.T, ctx context.Context, rdb *redis.Client, n string) time.Duration {
	t.Helper()
	held, err := rdb.ZRangeWithScores(ctx, key(n)+":h", 0, -1).Result()
	require.NoError(t, err)
	require.Len(t, held, 1)
	now, err := rdb.Time(ctx).Result()
	require.NoError(t, err)
	return time.Duration(int64(held[0].Score)-now.UnixMilli()) * time.Millisecond
}

// A release grants the queued request its permits in the same script: the
// waiter on another Client holds from the message, without a try of its
// own; the permit is the waiter's in Redis (in H, counted in used, out of
// the queue) with a token after the holder's, on what was left of its
// waiting mark (a third of the 30 s watchdog timeout) as its lease.
func TestSemaphore_Release_GrantsTheQueuedRequest_WaiterTakesItWithoutATry(t *testing.T) {
	e := realEnv(t)
	rdb := e.rdb()
	ctx := ctxTimeout(t, 20*time.Second)
	n := name(t)
	tries := &scriptCalls{s: scripts.SemTry}
	a, b := e.client(e.rdb()), e.client(e.rdb(tries))
	_, p := allPermitsHeld(t, ctx, a, n, 2)
	got := queuedSemWaiter(t, ctx, rdb, b, b.Semaphore(n), n, 2, 1)
	before := tries.n.Load()
	require.NoError(t, p.Release(ctx))
	q := servedWithin(t, got, 5*time.Second, "the waiter was not served")
	assert.Equal(t, before, tries.n.Load(), "the waiter tried again instead of taking the grant")
	assert.Equal(t, 2, q.Count())
	assert.Greater(t, q.Token(), p.Token())
	m, err := rdb.HGetAll(ctx, key(n)).Result()
	require.NoError(t, err)
	assert.Equal(t, "2", m["used"])
	assert.Equal(t, strconv.FormatUint(q.Token(), 10), m["f"])
	assert.Zero(t, rdb.ZCard(ctx, key(n)+":q").Val()+rdb.ZCard(ctx, key(n)+":qe").Val(), "the served request is still queued")
	left := onlyPermitLeft(t, ctx, rdb, n)
	assert.True(t, left > 5*time.Second && left <= 10*time.Second, "the granted lease has %v left", left)
	require.NoError(t, q.Release(ctx))
	assert.Equal(t, "0", rdb.HGet(ctx, key(n), "used").Val())
}

// A waiter with a fixed permit lease does not take the grant from the
// message, whose lease is what was left of its mark: its try claims the
// permit with its own lease and a new token, and takes no permit twice.
func TestSemaphore_Release_FixedLeaseWaiter_ClaimsTheGrantWithItsLease(t *testing.T) {
	e := realEnv(t)
	rdb := e.rdb()
	ctx := ctxTimeout(t, 20*time.Second)
	n := name(t)
	tries := &scriptCalls{s: scripts.SemTry}
	a, b := e.client(e.rdb()), e.client(e.rdb(tries))
	holder, p := allPermitsHeld(t, ctx, a, n, 3)
	got := queuedSemWaiter(t, ctx, rdb, b, b.Semaphore(n, dlock.WithPermitLease(2*time.Second)), n, 2, 1)
	before := tries.n.Load()
	require.NoError(t, p.Release(ctx))
	q := <-got
	require.NotNil(t, q)
	assert.Equal(t, before+1, tries.n.Load(), "one try claims the grant")
	assert.Equal(t, "2", rdb.HGet(ctx, key(n), "used").Val(), "the claim took the permits again")
	assert.Equal(t, strconv.FormatUint(q.Token(), 10), rdb.HGet(ctx, key(n), "f").Val(), "the claim's token is not the last issued")
	left := onlyPermitLeft(t, ctx, rdb, n)
	assert.True(t, left > time.Second && left <= 2*time.Second, "the claimed lease has %v left", left)
	avail, err := holder.Available(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, avail)
	require.NoError(t, q.Release(ctx))
	avail, err = holder.Available(ctx)
	require.NoError(t, err)
	assert.Equal(t, 3, avail)
}

// A request the release granted, whose waiter stops waiting before it takes
// the grant, gives the permits back when it leaves the queue (sem_cancel),
// and they go to the request behind it. The waiter here is a place in the
// queue with no Client behind it; its cancel is run as its Client would.
func TestSemaphore_GrantedRequestCancelled_PermitsGoBack(t *testing.T) {
	e := realEnv(t)
	rdb := e.rdb()
	ctx := ctxTimeout(t, 20*time.Second)
	n := name(t)
	c := e.client(e.rdb())
	s := c.Semaphore(n)
	require.NoError(t, s.SetPermits(ctx, 1))
	p, err := s.Acquire(ctx, 1)
	require.NoError(t, err)
	now, err := rdb.Time(ctx).Result()
	require.NoError(t, err)
	const gone = "gone.g.x"
	k := key(n)
	require.NoError(t, rdb.ZAdd(ctx, k+":q", redis.Z{Score: 0, Member: gone}).Err())
	require.NoError(t, rdb.ZAdd(ctx, k+":qe", redis.Z{Score: float64(now.UnixMilli() + 10000), Member: gone}).Err())
	require.NoError(t, rdb.HSet(ctx, k+":c", gone, 1).Err())
	behind := queuedSemWaiter(t, ctx, rdb, c, c.Semaphore(n), n, 1, 2)
	require.NoError(t, p.Release(ctx))
	assert.NotZero(t, rdb.ZScore(ctx, k+":h", gone).Val(), "the release did not grant the request at the head")
	assert.Equal(t, "1", rdb.HGet(ctx, k, "used").Val())
	keys := []string{k, k + ":h", k + ":c", k + ":q", k + ":qe", k + ":ch"}
	require.NoError(t, scripts.SemCancel.Run(ctx, rdb, keys, gone, "gone").Err())
	assert.Zero(t, rdb.ZScore(ctx, k+":h", gone).Val(), "the cancelled grant still holds")
	q := servedWithin(t, behind, 5*time.Second, "the request behind was not served when the grant came back")
	require.NoError(t, q.Release(ctx))
	assert.Equal(t, "0", rdb.HGet(ctx, k, "used").Val())
}

// A request whose ID does not say that its Client takes grants (an earlier
// version's, '<client>.p.<...>', whose try would take the permits a second
// time) is named in a release message instead, and stays queued for its
// try, while a request behind it that takes grants is granted its permits.
func TestSemaphore_Release_EarlierVersionsRequest_NamedNotGranted(t *testing.T) {
	e := realEnv(t)
	rdb := e.rdb()
	ctx := ctxTimeout(t, 20*time.Second)
	n := name(t)
	s := e.client(e.rdb()).Semaphore(n)
	require.NoError(t, s.SetPermits(ctx, 2))
	p, err := s.Acquire(ctx, 2)
	require.NoError(t, err)
	now, err := rdb.Time(ctx).Result()
	require.NoError(t, err)
	k := key(n)
	for i, id := range []string{"old.p.x", "new.g.y"} {
		require.NoError(t, rdb.ZAdd(ctx, k+":q", redis.Z{Score: float64(i), Member: id}).Err())
		require.NoError(t, rdb.ZAdd(ctx, k+":qe", redis.Z{Score: float64(now.UnixMilli() + 10000), Member: id}).Err())
		require.NoError(t, rdb.HSet(ctx, k+":c", id, 1).Err())
	}
	spy := rdb.Subscribe(ctx, k+":ch")
	defer spy.Close()
	_, err = spy.Receive(ctx)
	require.NoError(t, err)
	require.NoError(t, p.Release(ctx))
	var got []string
	for range 2 {
		msg, err := spy.ReceiveMessage(ctx)
		require.NoError(t, err)
		_, rest, _ := strings.Cut(msg.Payload, "|")
		got = append(got, rest)
	}
	token := rdb.HGet(ctx, k, "f").Val()
	assert.ElementsMatch(t, []string{"1|g|new.g.y|" + token + "|", "0||old.p.x"}, trimTTL(got))
	assert.Zero(t, rdb.ZScore(ctx, k+":h", "old.p.x").Val(), "the earlier version's request was granted")
	assert.NotZero(t, rdb.ZScore(ctx, k+":h", "new.g.y").Val(), "the request that takes grants was not granted")
	assert.Equal(t, []string{"old.p.x"}, rdb.ZRange(ctx, k+":q", 0, -1).Val())
	assert.Equal(t, "1", rdb.HGet(ctx, k, "used").Val())
}

// trimTTL drops the lease at the end of hand-over messages ('1|g|id|token|ttl').
func trimTTL(msgs []string) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		if strings.HasPrefix(m, "1|g|") {
			m = m[:strings.LastIndexByte(m, '|')+1]
		}
		out[i] = m
	}
	return out
}

// A grant whose message is lost (the waiter's Client was cut off when the
// release published it, and its connections dropped) is claimed by the
// waiter's try once its Client subscribes again, long before the grant's
// lease would have run out: the permits are the waiter's once, not twice,
// under one token, the last issued.
func TestSemaphore_GrantMessageLost_WaiterClaimsItAfterReconnecting(t *testing.T) {
	e := realEnv(t)
	rdb := e.rdb()
	ctx := ctxTimeout(t, 30*time.Second)
	n := name(t)
	tries := &scriptCalls{s: scripts.SemTry}
	proxied, proxy := e.proxied(tries)
	a, b := e.client(e.rdb()), e.client(proxied)
	_, p := allPermitsHeld(t, ctx, a, n, 2)
	got := queuedSemWaiter(t, ctx, rdb, b, b.Semaphore(n), n, 2, 1)
	proxy.Partition()
	require.NoError(t, p.Release(ctx))
	assert.Equal(t, int64(1), rdb.ZCard(ctx, key(n)+":h").Val(), "the release did not grant the waiter")
	before := tries.n.Load()
	proxy.DropAll() // the message dies with the connection
	proxy.Heal()
	// The grant's own lease (what was left of the mark) is 10 s.
	q := servedWithin(t, got, 5*time.Second, "the waiter did not take its grant soon after reconnecting")
	assert.Greater(t, tries.n.Load(), before, "the waiter took a grant whose message was lost without a try")
	assert.Equal(t, "2", rdb.HGet(ctx, key(n), "used").Val(), "the permits were taken twice")
	assert.Equal(t, strconv.FormatUint(q.Token(), 10), rdb.HGet(ctx, key(n), "f").Val())
	assert.Greater(t, q.Token(), p.Token())
	assert.Equal(t, int64(1), rdb.ZCard(ctx, key(n)+":h").Val())
	require.NoError(t, q.Release(ctx))
	assert.Equal(t, "0", rdb.HGet(ctx, key(n), "used").Val())
}

// A waiter that gives up while the grant of its permits is on its way (its
// Client's link is slow) gives them back as it leaves the queue: the request
// behind it is served long before the untaken grant's lease (what was left
// of the mark, 10 s) would have run out, and every permit is counted once.
func TestSemaphore_WaiterGivesUpWithAGrantOnItsWay_PermitsGoToTheNext(t *testing.T) {
	e := realEnv(t)
	rdb := e.rdb()
	ctx := ctxTimeout(t, 30*time.Second)
	n := name(t)
	slow, proxy := e.proxied()
	a, b, c := e.client(e.rdb()), e.client(slow), e.client(e.rdb())
	_, p := allPermitsHeld(t, ctx, a, n, 1)
	bctx, giveUp := context.WithCancel(ctx)
	defer giveUp()
	bErr := make(chan error, 1)
	go func() {
		q, err := b.Semaphore(n).Acquire(bctx, 1)
		if err == nil {
			_ = q.Release(ctx)
		}
		bErr <- err
	}()
	require.Eventually(t, func() bool { return rdb.ZCard(ctx, key(n)+":q").Val() == 1 }, 5*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { return dlock.LocalWaiters(b) == 1 }, 5*time.Second, time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	behind := queuedSemWaiter(t, ctx, rdb, c, c.Semaphore(n), n, 1, 2)
	proxy.SetLatency(300*time.Millisecond, 300*time.Millisecond)
	require.NoError(t, p.Release(ctx))
	require.Equal(t, int64(1), rdb.ZCard(ctx, key(n)+":h").Val(), "the release did not grant b's request")
	giveUp() // before the grant's message reaches b
	require.ErrorIs(t, <-bErr, dlock.ErrNotObtained)
	start := time.Now()
	q := servedWithin(t, behind, 5*time.Second, "the request behind waited for the untaken grant's lease")
	assert.Equal(t, "1", rdb.HGet(ctx, key(n), "used").Val())
	require.NoError(t, q.Release(ctx))
	t.Logf("served %v after b gave up", time.Since(start).Round(time.Millisecond))
	assert.Equal(t, "0", rdb.HGet(ctx, key(n), "used").Val())
}
