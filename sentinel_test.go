package dlock_test

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

func TestSentinel_FailoverWhileBlocked_WaitersStillAcquire(t *testing.T) {
	long(t)
	s := redistest.Sentinel(t)
	newFailover := func() *redis.Client {
		rdb := redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName: s.MasterName, SentinelAddrs: []string{s.SentinelAddr},
		})
		t.Cleanup(func() { _ = rdb.Close() })
		return rdb
	}
	ctx := ctxTimeout(t, time.Minute)
	n := name(t)
	holder := dlock.New(newFailover())
	t.Cleanup(func() { _ = holder.Close() })
	h := holder.Mutex(n)
	require.NoError(t, h.Lock(ctx))

	var served atomic.Int32
	var wg sync.WaitGroup
	for range 2 {
		c := dlock.New(newFailover())
		t.Cleanup(func() { _ = c.Close() })
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				m := c.Mutex(n)
				if assert.NoError(t, m.Lock(ctx)) {
					served.Add(1)
					assert.NoError(t, m.Unlock(ctx))
				}
			}()
		}
	}
	time.Sleep(300 * time.Millisecond)
	s.Failover(t)
	// The lock reached the replica before the failover (the test waited for
	// sync), so the holder still holds it on the new master.
	require.Eventually(t, func() bool { return h.Unlock(ctx) == nil }, 20*time.Second, 100*time.Millisecond,
		"Unlock on the new master")
	within(t, waitGroupDone(&wg), 30*time.Second, "all waiters acquiring after the failover")
	assert.EqualValues(t, 6, served.Load())
}

// failoverTrials is how many trials TestSentinel_FailoverRightAfterGrant
// runs of each mode: DLOCK_FAILOVER_TRIALS, or 2. Each takes a few seconds
// (the sentinel noticing the dead master and failing over, then the old
// master restarted and resynced).
func failoverTrials(t *testing.T) int {
	if v := os.Getenv("DLOCK_FAILOVER_TRIALS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, "DLOCK_FAILOVER_TRIALS")
		return n
	}
	return 2
}

// replLink is the state of the replication link when a grant is made.
type replLink int

const (
	linkHealthy replLink = iota // the replica gets every write at once
	linkSlow                    // linkLatency each way: the replica lags
	linkCut                     // nothing passes: the replica gets nothing
)

func (l replLink) String() string { return [...]string{"healthy", "slow", "cut"}[l] }

// linkLatency is the one-way latency of a slow replication link: a
// replica that lags by that much, as on a busy network or behind a big
// write. A WAIT for it takes about twice as long.
const linkLatency = 150 * time.Millisecond

// failoverAck is the WithSyncReplicas timeout of the failover trials: above
// twice linkLatency with room for -race, so that a slow replica still
// acknowledges, and short, since a cut one never does.
const failoverAck = time.Second

// TestSentinel_FailoverRightAfterGrant takes a lock and kills the master at
// once (SIGKILL); the sentinel notices and promotes the replica, and the
// test looks for the hold there. The replica replicates through a proxy,
// so each trial sets its link first: healthy, slow (linkLatency each way)
// or cut. When the master dies, whatever the link still held back is lost,
// as what a dead master had not yet sent is.
//
// Without WithSyncReplicas a grant the replica has not received is lost:
// on a cut link always, on a slow one whenever the master dies within the
// lag. With WithSyncReplicas(1, ...), a Lock either returns
// ErrNotReplicated (and holds nothing) or succeeds with the hold on the
// replica, so that it survives the failover: never a grant that the new
// master lacks.
func TestSentinel_FailoverRightAfterGrant(t *testing.T) {
	long(t)
	s := redistest.SentinelProxied(t)
	trials := failoverTrials(t)
	for _, link := range []replLink{linkHealthy, linkSlow, linkCut} {
		for _, sync := range []bool{false, true} {
			var lost, notReplicated int
			var slowest time.Duration
			for range trials {
				r := failoverAfterGrant(t, s, sync, link)
				if t.Failed() {
					t.FailNow()
				}
				switch {
				case r.notReplicated:
					notReplicated++
				case !r.kept:
					lost++
				}
				slowest = max(slowest, r.took)
			}
			t.Logf("WithSyncReplicas %-5v link %-7v: lock lost in %2d of %d failovers, ErrNotReplicated %2d, slowest Lock %v",
				sync, link, lost, trials, notReplicated, slowest.Round(time.Millisecond))
			switch {
			case sync:
				assert.Zero(t, lost, "with WithSyncReplicas, a granted lock survives every failover")
			case link == linkCut:
				// The replica cannot have the grant: this checks the setup.
				assert.Equal(t, trials, lost, "without WithSyncReplicas, a grant the replica never got is lost")
			}
			if sync && link == linkCut {
				assert.Equal(t, trials, notReplicated, "a replica cut off acknowledges nothing")
			}
			if sync && link == linkHealthy {
				assert.Zero(t, notReplicated, "a healthy replica acknowledges within %v", failoverAck)
			}
		}
	}
}

// grantOutcome is one failover trial's result.
type grantOutcome struct {
	notReplicated bool          // Lock returned ErrNotReplicated (held nothing)
	kept          bool          // Lock succeeded and the new master has the hold
	took          time.Duration // how long Lock took
}

// failoverAfterGrant runs one trial: it sets the replication link, takes a
// lock on the master, kills the master as soon as Lock returns, drops what
// the link still held, waits for the sentinel to promote the replica and
// looks for the hold there. A Lock that fails must be ErrNotReplicated and
// leave nothing held. Then the old master is restarted empty as a replica
// of the new one, in sync, for the next trial.
func failoverAfterGrant(t *testing.T, s *redistest.ProxiedSentinel, sync bool, link replLink) (r grantOutcome) {
	t.Helper()
	ctx := ctxTimeout(t, time.Minute)
	master, replica := s.AwaitReady(t)
	proxy := s.Link(master)
	rdb := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName: s.MasterName, SentinelAddrs: []string{s.SentinelAddr}, ReadTimeout: 10 * time.Second,
	})
	defer rdb.Close()
	var opts []dlock.Option
	if sync {
		opts = append(opts, dlock.WithSyncReplicas(1, failoverAck))
	}
	c := dlock.New(rdb, opts...)
	defer c.Close()
	warm := c.Mutex(name(t)) // connections and script cache, so that Lock is one round trip
	require.NoError(t, warm.Lock(ctx))
	require.NoError(t, warm.Unlock(ctx))

	switch link {
	case linkSlow:
		proxy.SetLatency(linkLatency, linkLatency)
	case linkCut:
		proxy.Partition()
	}
	m := c.Mutex(name(t))
	start := time.Now()
	err := m.Lock(ctx)
	r.took = time.Since(start)
	// The master dies right after the grant. What the link still held back
	// is lost with it: freeze the link, kill, then drop its connections.
	if link != linkHealthy {
		proxy.Partition()
	}
	master.Stop()
	if link != linkHealthy {
		proxy.DropAll()
	}
	proxy.Heal()
	proxy.SetLatency(0, 0)

	s.AwaitMaster(t, replica)
	onNew := redis.NewClient(&redis.Options{Addr: replica.Addr})
	defer onNew.Close()
	v, herr := onNew.HMGet(ctx, key(m.Name()), "o", "f").Result()
	require.NoError(t, herr)
	holder, _ := v[0].(string)
	token, _ := v[1].(string)
	switch {
	case err == nil:
		r.kept = strings.HasPrefix(holder, c.ID()+".") && token == strconv.FormatUint(m.Token(), 10)
		if sync {
			assert.True(t, r.kept, "granted with WithSyncReplicas (token %d) but the new master has holder %q token %q",
				m.Token(), holder, token)
		}
	case sync && errors.Is(err, dlock.ErrNotReplicated):
		r.notReplicated = true
		assert.Zero(t, m.Token(), "a Lock that failed holds nothing")
		if link == linkCut {
			// (On a link that passes anything, the grant could reach the
			// replica and its give-back not: a hold left to its lease, which
			// the Client does not believe it has.)
			assert.Empty(t, holder, "a grant the replica never got is not on the new master")
		}
	default:
		t.Errorf("Lock: %v", err)
	}
	s.Rejoin(t, master, replica)
	return r
}
