package dlock_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock"
)

// WithRenewedLease sets one handle's recovery time: its holds are renewed
// on a lease of their own while the Client's other holds keep the Client's
// watchdog timeout, and when the holder's process dies (here: its Client
// closes without releasing) the next campaigner leads about a lease later,
// not the Client's 30 s later (issue 23: a new leader 28 s after a SIGKILL).
func TestRenewedLease_ElectionFailsOverWithinItsLease_OtherHoldsKeepTheClientsLease(t *testing.T) {
	e := realEnv(t)
	ctx := ctxTimeout(t, 30*time.Second)
	rdb := e.rdb()
	const lease = 600 * time.Millisecond
	leaderC := dlock.New(e.rdb()) // the default watchdog timeout: 30s
	t.Cleanup(func() { _ = leaderC.Close() })
	n := name(t)
	leader := leaderC.Election(n, dlock.WithRenewedLease(lease))
	require.NoError(t, leader.Campaign(ctx, "first"))
	plain := leaderC.Mutex(n + "-plain")
	require.NoError(t, plain.Lock(ctx))

	// Renewed on its own lease for three leases, never lost.
	for end := time.Now().Add(3 * lease); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		select {
		case <-leader.Lost():
			t.Fatal("the leadership was lost while its Client renewed it")
		default:
		}
		d, err := rdb.PTTL(ctx, key(n)).Result()
		require.NoError(t, err)
		require.Positive(t, d)
		require.LessOrEqual(t, d, lease, "the leadership's lease on the server")
	}
	d, err := rdb.PTTL(ctx, key(n+"-plain")).Result()
	require.NoError(t, err)
	assert.Greater(t, d, 10*time.Second, "a handle without the option keeps the Client's 30s lease")

	next := e.client(e.rdb()).Election(n, dlock.WithRenewedLease(lease))
	led := make(chan time.Time, 1)
	go func() {
		if err := next.Campaign(ctx, "second"); err != nil {
			t.Error(err)
		}
		led <- time.Now()
	}()
	time.Sleep(50 * time.Millisecond)
	died := time.Now()
	require.NoError(t, leaderC.Close()) // no Resign: the leadership ends by its lease
	at := <-led
	took := at.Sub(died)
	t.Logf("leader gone at 0, next leader at %v (lease %v)", took.Round(time.Millisecond), lease)
	assert.Less(t, took, lease+500*time.Millisecond, "failover took longer than the handle's lease")
	v, err := next.Leader(ctx)
	require.NoError(t, err)
	assert.Equal(t, "second", v)
	require.NoError(t, next.Resign(ctx))
}

// A Semaphore's WithRenewedPermitLease: permits renewed on their own lease,
// and a dead holder's permits back about a lease after it died.
func TestRenewedPermitLease_PermitsBackWithinTheLeaseAfterTheHolderDies(t *testing.T) {
	e := realEnv(t)
	ctx := ctxTimeout(t, 30*time.Second)
	const lease = 600 * time.Millisecond
	n := name(t)
	holderC := dlock.New(e.rdb())
	t.Cleanup(func() { _ = holderC.Close() })
	s := holderC.Semaphore(n, dlock.WithRenewedPermitLease(lease))
	_, err := s.TrySetPermits(ctx, 2)
	require.NoError(t, err)
	p, err := s.Acquire(ctx, 2)
	require.NoError(t, err)
	time.Sleep(3 * lease)
	select {
	case <-p.Lost():
		t.Fatal("the permit was lost while its Client renewed it")
	default:
	}
	other := e.client(e.rdb()).Semaphore(n)
	free, err := other.Available(ctx)
	require.NoError(t, err)
	require.Zero(t, free, "the permits are held")

	died := time.Now()
	require.NoError(t, holderC.Close())
	got, err := other.Acquire(ctx, 2)
	require.NoError(t, err)
	took := time.Since(died)
	t.Logf("holder gone at 0, permits taken again at %v (lease %v)", took.Round(time.Millisecond), lease)
	assert.Less(t, took, lease+500*time.Millisecond, "the permits came back later than the handle's lease")
	require.NoError(t, got.Release(ctx))
}

// A waiter queued through a handle with a short renewed lease keeps its
// place with a mark of a third of it: a waiter that dies holds the queue up
// that long at most, not the Client's mark of 10 s.
func TestRenewedLease_DeadWaiterHoldsTheQueueUpForAThirdOfIt(t *testing.T) {
	e := realEnv(t)
	ctx := ctxTimeout(t, 30*time.Second)
	const lease = 600 * time.Millisecond
	n := name(t)
	holder := e.client(e.rdb()).Mutex(n, dlock.WithRenewedLease(lease))
	require.NoError(t, holder.Lock(ctx))
	deadRdb, link := e.proxied()
	deadC := dlock.New(deadRdb)
	t.Cleanup(func() { _ = deadC.Close() })
	go func() { _ = deadC.Mutex(n, dlock.WithRenewedLease(lease)).Lock(ctx) }()
	waitQueued(t, e, n, 1)
	link.Partition() // the waiter's process is cut off: its place stays until its mark runs out
	defer link.Heal()
	start := time.Now()
	require.NoError(t, holder.Unlock(ctx)) // handed to the dead waiter, for what its mark has left
	next := e.client(e.rdb()).Mutex(n)
	require.NoError(t, next.Lock(ctx))
	took := time.Since(start)
	t.Logf("a dead waiter held the queue up for %v", took.Round(time.Millisecond))
	assert.Less(t, took, lease/3+300*time.Millisecond)
	require.NoError(t, next.Unlock(ctx))
}
