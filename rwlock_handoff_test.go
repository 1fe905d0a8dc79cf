package dlock_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock"
)

// A writer's last Unlock takes rw_unlock_write's fast path when no reader
// holds or is queued: to the first writer queued when its mark is live, or
// freeing the lock when nobody is queued. Otherwise the slow path runs: a
// dead mark ahead of the writer, or an expired reader still in the read
// set, both of which it purges. Both paths leave the same state: the new
// writer with count 1, the token after the old one (seeded an hour ahead of
// the clock), the token memory, a lease no longer than its mark, and
// nobody queued; a freed lock keeps its kind and token for a minute. INFO
// commandstats tells the paths apart: only the slow path purges
// (ZRANGEBYSCORE).
func TestRWUnlockWrite_FastPath_LeavesWhatTheSlowPathLeaves(t *testing.T) {
	e := realEnv(t) // its own server: commandstats count only this test
	rdb := e.rdb()
	ctx := ctxTimeout(t, 20*time.Second)
	a, b := e.client(e.rdb()), e.client(e.rdb())
	type outcome struct {
		fields          map[string]string // of W, with o and f replaced by what they must be
		tokenNext       bool
		memoryIsToken   bool
		leaseWithinMark bool // W's lease, and the lease the grant message gave
		queued          int64
		purged          bool
	}
	// waitFor: 0 for nobody queued, else the waiter's lease bound: the
	// mark lease, a third of the 30 s watchdog timeout, when it has no
	// fixed lease (wlease 0).
	run := func(t *testing.T, waitFor, wlease time.Duration, slow bool) outcome {
		n := name(t)
		waiter := waitFor > 0
		hctx, wctx := dlock.WithNewOwner(ctx), dlock.WithNewOwner(ctx)
		var opts []dlock.LockOption
		if wlease > 0 {
			opts = append(opts, dlock.WithLease(wlease))
		}
		h, w := a.RWMutex(n), b.RWMutex(n, opts...)
		require.NoError(t, h.Lock(hctx))
		seeded := h.Token(hctx) + uint64(time.Hour/time.Microsecond)
		require.NoError(t, rdb.HSet(ctx, key(n), "f", seeded).Err())
		ks := queueKeys(n)
		got := make(chan error, 1)
		if waiter {
			go func() { got <- w.Lock(wctx) }()
			waitQueued(t, e, n, 1)
			// Its try again once subscribed purges too: let it pass first.
			require.Eventually(t, func() bool { return dlock.LocalWaiters(b) == 1 }, 5*time.Second, time.Millisecond)
			time.Sleep(50 * time.Millisecond)
		}
		if slow && waiter { // a dead writer's mark ahead of the waiter
			require.NoError(t, rdb.ZAdd(ctx, ks[1], redis.Z{Score: 1, Member: "0:wdead.x"}).Err())
			require.NoError(t, rdb.ZAdd(ctx, ks[2], redis.Z{Score: 1, Member: "0:wdead.x"}).Err())
		}
		if slow && !waiter { // a reader whose lease ran out, not yet purged
			require.NoError(t, rdb.ZAdd(ctx, ks[4], redis.Z{Score: 1, Member: "dead.x"}).Err())
			require.NoError(t, rdb.HSet(ctx, key(n)+":rc", "dead.x", 1).Err())
		}
		spy := rdb.Subscribe(ctx, ks[5])
		defer spy.Close()
		_, err := spy.Receive(ctx) // the confirmation
		require.NoError(t, err)
		// h's grant reserved tokens after its own for its cohort (the
		// default): the next grant's token follows them.
		reserved, _ := rdb.HGet(ctx, key(n), "x").Uint64()
		before := cmdCalls(t, rdb, "zrangebyscore")
		require.NoError(t, h.Unlock(hctx))
		var o outcome
		fields, err := rdb.HGetAll(ctx, key(n)).Result()
		require.NoError(t, err)
		memory := rdb.Get(ctx, ks[3]).Val()
		pttl := rdb.PTTL(ctx, key(n)).Val()
		if waiter {
			require.NoError(t, <-got)
			tok := w.Token(wctx)
			o.tokenNext = reserved == dlock.DefaultCohortHandoffs && tok == seeded+reserved+1 && fields["f"] == strconv.FormatUint(tok, 10)
			msg, err := spy.ReceiveMessage(ctx) // from|1|g|owner|token|ttl
			require.NoError(t, err)
			parts := strings.Split(msg.Payload, "|")
			require.Len(t, parts, 6, msg.Payload)
			granted, err := strconv.Atoi(parts[5])
			require.NoError(t, err)
			o.leaseWithinMark = pttl > 0 && pttl <= waitFor && granted > 0 && time.Duration(granted)*time.Millisecond <= waitFor
			o.fields = map[string]string{"k": fields["k"], "n": fields["n"],
				"o is the waiter's": strconv.FormatBool(fields["o"] != "" && fields["o"] != "wdead.x")}
		} else {
			o.tokenNext = fields["f"] == strconv.FormatUint(seeded, 10)
			o.leaseWithinMark = pttl > 50*time.Second && pttl <= time.Minute // fence memory
			o.fields = fields
			delete(o.fields, "f")
		}
		o.purged = cmdCalls(t, rdb, "zrangebyscore") > before
		o.memoryIsToken = !waiter || memory == fields["f"] && fields["x"] == "" || memory == fields["f"]+"+"+fields["x"]
		o.queued = rdb.ZCard(ctx, ks[1]).Val() + rdb.ZCard(ctx, ks[2]).Val() + rdb.ZCard(ctx, ks[4]).Val() + rdb.HLen(ctx, key(n)+":rc").Val()
		if waiter {
			require.NoError(t, w.Unlock(wctx))
		}
		return o
	}
	for _, tc := range []struct {
		name           string
		waitFor, lease time.Duration
	}{{"writer waits", 10 * time.Second, 0}, {"writer with a fixed lease waits", 3 * time.Second, 3 * time.Second}, {"nobody waits", 0, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			waiter := tc.waitFor > 0
			fast, slow := run(t, tc.waitFor, tc.lease, false), run(t, tc.waitFor, tc.lease, true)
			assert.False(t, fast.purged, "the fast case was served by the slow path")
			assert.True(t, slow.purged, "the slow case was not purged")
			fast.purged, slow.purged = false, false
			assert.Equal(t, slow, fast)
			assert.True(t, fast.tokenNext && fast.memoryIsToken && fast.leaseWithinMark, "%+v", fast)
			assert.Zero(t, fast.queued)
			if waiter {
				assert.Equal(t, map[string]string{"k": "rwlock", "n": "1", "o is the waiter's": "true"}, fast.fields)
			} else {
				assert.Equal(t, map[string]string{"k": "rwlock", "x": strconv.Itoa(dlock.DefaultCohortHandoffs)}, fast.fields,
					"a freed lock keeps its kind, and its last token and reservation (f, x)")
			}
		})
	}
}

// A reader queued behind the writer keeps the writer's release on the slow
// path, which lets every reader queued in first (rw_common.lua): the reader
// holds, the writer that queued first still waits.
func TestRWUnlockWrite_ReaderQueued_ReadersGoFirst(t *testing.T) {
	e := realEnv(t)
	rdb := e.rdb()
	ctx := ctxTimeout(t, 20*time.Second)
	a, b := e.client(e.rdb()), e.client(e.rdb())
	n := name(t)
	hctx, wctx, rctx := dlock.WithNewOwner(ctx), dlock.WithNewOwner(ctx), dlock.WithNewOwner(ctx)
	h, rw := a.RWMutex(n), b.RWMutex(n)
	require.NoError(t, h.Lock(hctx))
	wrote, read := make(chan error, 1), make(chan error, 1)
	go func() { wrote <- rw.Lock(wctx) }()
	waitQueued(t, e, n, 1)
	go func() { read <- rw.RLock(rctx) }()
	waitQueued(t, e, n, 2)
	before := cmdCalls(t, rdb, "zrangebyscore")
	require.NoError(t, h.Unlock(hctx))
	select {
	case err := <-read:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("the queued reader was not let in")
	}
	assert.Greater(t, cmdCalls(t, rdb, "zrangebyscore"), before, "the release took the fast path")
	select {
	case err := <-wrote:
		t.Fatalf("the writer got in while a reader holds (err %v)", err)
	case <-time.After(100 * time.Millisecond):
	}
	require.NoError(t, rw.RUnlock(rctx))
	require.NoError(t, <-wrote)
	require.NoError(t, rw.Unlock(wctx))
}

// A writer's Unlock with a key of another type where the RWMutex keeps its
// queue, its marks, its read set or its read counts is refused with the key
// named, and writes nothing: the fast path checks them before any write and
// leaves a bad key to the slow path, which names it.
func TestRWUnlockWrite_ForeignKey_NamedNothingWritten(t *testing.T) {
	e := realEnv(t)
	rdb := e.rdb()
	ctx := ctxTimeout(t, 10*time.Second)
	for _, tc := range []struct {
		suffix string
		queued bool // a writer queued, so that its mark is read
	}{{":mq", false}, {":mqe", true}, {":mqe", false}, {":rl", false}, {":rc", false}} {
		suffix := tc.suffix
		t.Run(fmt.Sprintf("%s queued=%v", suffix, tc.queued), func(t *testing.T) {
			n := name(t)
			octx := dlock.WithNewOwner(ctx)
			rw := e.client(e.rdb()).RWMutex(n)
			require.NoError(t, rw.Lock(octx))
			if tc.queued {
				require.NoError(t, rdb.ZAdd(ctx, key(n)+":mq", redis.Z{Score: 1, Member: "0:wx.y"}).Err())
			}
			bad := key(n) + suffix
			require.NoError(t, rdb.RPush(ctx, bad, "x").Err())
			refusedNamingKey(t, ctx, rdb, n, bad, "list", func() error { return rw.Unlock(octx) })
		})
	}
}
