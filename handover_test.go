package dlock_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock"
)

// A hold handed over as text is released by another Client: the lock goes
// to the first waiter, woken at once whether it waits on the releasing
// Client or on a third one; the handle that gave the hold away no longer
// has it.
func TestHandOver_ReleasedByAnotherClient_WakesWaiter(t *testing.T) {
	for _, where := range []string{"waiter on the releasing Client", "waiter on a third Client"} {
		t.Run(where, func(t *testing.T) {
			e := sharedEnv(t)
			ctx := ctxTimeout(t, 10*time.Second)
			holder, releaser := e.client(e.rdb()), e.client(e.rdb())
			waiterClient := e.client(e.rdb())
			if where == "waiter on the releasing Client" {
				waiterClient = releaser
			}
			n := name(t)
			m := holder.Mutex(n)
			require.NoError(t, m.Lock(ctx))
			token := m.Token()
			work, done := m.HoldContext(ctx)
			defer done()

			ref, err := m.HandOver()
			require.NoError(t, err)
			assert.Equal(t, dlock.HoldRef{Name: n, Kind: dlock.KindMutex, ID: ref.ID, Token: token}, ref)
			st, err := m.Status(ctx)
			require.NoError(t, err)
			require.Len(t, st.Holders, 1)
			assert.Equal(t, st.Holders[0].ID, ref.ID, "the ref names the hold stored in Redis")

			// The giver no longer holds it.
			within(t, work.Done(), time.Second, "the giver's hold context")
			assert.NotErrorIs(t, context.Cause(work), dlock.ErrLost)
			assert.Zero(t, m.Token())
			assert.Nil(t, m.Lost())
			assert.ErrorIs(t, m.Unlock(ctx), dlock.ErrNotHeld)
			assert.ErrorIs(t, m.Extend(ctx, time.Second), dlock.ErrNotHeld)
			_, err = m.HandOver()
			assert.ErrorIs(t, err, dlock.ErrNotHeld)

			got := make(chan struct{})
			w := waiterClient.Mutex(n)
			go func() {
				defer close(got)
				assert.NoError(t, w.Lock(ctx))
			}()
			require.Eventually(t, func() bool {
				st, err := m.Status(ctx)
				return err == nil && st.Waiting == 1
			}, 2*time.Second, 5*time.Millisecond)

			text, err := ref.MarshalText() // over the wire
			require.NoError(t, err)
			var back dlock.HoldRef
			require.NoError(t, back.UnmarshalText(text))
			require.Equal(t, ref, back)
			released := time.Now()
			require.NoError(t, releaser.ReleaseRef(ctx, back))
			// The 30s lease rules out expiry: only the release hands it on.
			within(t, got, 2*time.Second, "the waiter after ReleaseRef")
			t.Logf("%s: woken %v after ReleaseRef", where, time.Since(released))
			assert.Greater(t, w.Token(), token)
			assert.ErrorIs(t, releaser.ReleaseRef(ctx, back), dlock.ErrNotHeld, "a second ReleaseRef")
			st, err = m.Status(ctx)
			require.NoError(t, err)
			require.Len(t, st.Holders, 1)
			require.NoError(t, w.Unlock(ctx))
		})
	}
}

// After HandOver nothing renews the hold: it ends by its lease unless the
// bearer extends it, and ExtendRef keeps it for the new lease.
func TestHandOver_WatchdogStops_ExtendRefKeepsIt(t *testing.T) {
	long(t)
	e := sharedEnv(t)
	ctx := ctxTimeout(t, 10*time.Second)
	holder := e.client(e.rdb(), dlock.WithWatchdogTimeout(time.Second))
	bearer, other := e.client(e.rdb()), e.client(e.rdb())
	n := name(t)

	// Without ExtendRef, the hold ends by the lease the watchdog last gave.
	m := holder.Mutex(n)
	require.NoError(t, m.Lock(ctx))
	time.Sleep(1200 * time.Millisecond) // renewed meanwhile
	ref, err := m.HandOver()
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		ok, err := other.Mutex(n).IsLocked(ctx)
		return err == nil && !ok
	}, 3*time.Second, 10*time.Millisecond, "the handed-over hold was still renewed")
	assert.ErrorIs(t, bearer.ExtendRef(ctx, ref, time.Second), dlock.ErrNotHeld)

	// With ExtendRef, it outlives the watchdog's lease.
	require.NoError(t, m.Lock(ctx))
	ref, err = m.HandOver()
	require.NoError(t, err)
	require.NoError(t, bearer.ExtendRef(ctx, ref, 4*time.Second))
	ttl, err := other.Mutex(n).TTL(ctx)
	require.NoError(t, err)
	assert.Greater(t, ttl, 3*time.Second)
	time.Sleep(1500 * time.Millisecond) // more than the watchdog's lease
	ok, err := other.Mutex(n).TryLock(ctx)
	require.NoError(t, err)
	assert.False(t, ok, "the extended hold ended early")
	st, err := other.Status(ctx, n)
	require.NoError(t, err)
	require.Len(t, st.Holders, 1)
	assert.Equal(t, ref.ID, st.Holders[0].ID)
	assert.Equal(t, ref.Token, st.Token, "ExtendRef changed the token")
	require.NoError(t, bearer.ReleaseRef(ctx, ref))
	ok, err = other.Mutex(n).TryLock(ctx)
	require.NoError(t, err)
	assert.True(t, ok)
}

// A stale ref (its hold expired and another Client took the lock) neither
// releases nor extends the newer hold.
func TestHandOver_StaleRef_LeavesNewerHoldAlone(t *testing.T) {
	e := sharedEnv(t)
	ctx := ctxTimeout(t, 10*time.Second)
	holder, bearer, next := e.client(e.rdb()), e.client(e.rdb()), e.client(e.rdb())
	n := name(t)
	m := holder.Mutex(n, dlock.WithLease(200*time.Millisecond))
	require.NoError(t, m.Lock(ctx))
	ref, err := m.HandOver()
	require.NoError(t, err)
	text := ref.String()

	newer := next.Mutex(n)
	require.NoError(t, newer.Lock(ctx)) // once the lease runs out
	before, err := newer.Status(ctx)
	require.NoError(t, err)

	stale, err := dlock.ParseHoldRef(text)
	require.NoError(t, err)
	assert.ErrorIs(t, bearer.ExtendRef(ctx, stale, time.Hour), dlock.ErrNotHeld)
	assert.ErrorIs(t, bearer.ReleaseRef(ctx, stale), dlock.ErrNotHeld)
	after, err := newer.Status(ctx)
	require.NoError(t, err)
	require.Len(t, after.Holders, 1)
	assert.Equal(t, before.Holders[0].ID, after.Holders[0].ID, "the newer hold was touched")
	assert.Equal(t, before.Token, after.Token)
	assert.Less(t, after.Holders[0].Lease, time.Minute, "a stale ExtendRef extended the newer hold")
	select {
	case <-newer.Lost():
		t.Fatal("the newer hold was lost")
	default:
	}
	require.NoError(t, newer.Unlock(ctx))
}

func TestHandOver_Malformed_ErrInvalid(t *testing.T) {
	e := sharedEnv(t)
	ctx := ctxTimeout(t, 5*time.Second)
	c := e.client(e.rdb())
	n := name(t)
	m := c.Mutex(n)
	require.NoError(t, m.Lock(ctx))
	defer m.Unlock(ctx)
	good := dlock.HoldRef{Name: n, Kind: dlock.KindMutex, ID: c.ID() + ".ABC", Token: 7}

	for _, s := range []string{
		"", "garbage", "dlock1 mutex 7", "dlock2 mutex 7 " + good.ID + " " + n,
		"dlock1 mutex x " + good.ID + " " + n, "dlock1 mutex 0 " + good.ID + " " + n,
		"dlock1 semaphore 7 " + good.ID + " " + n, "dlock1 mutex 7 noDot " + n,
		"dlock1 mutex 7 " + good.ID + " ", "dlock1 mutex 7 " + good.ID + " }x",
	} {
		_, err := dlock.ParseHoldRef(s)
		assert.ErrorIs(t, err, dlock.ErrInvalid, "%q", s)
		var r dlock.HoldRef
		assert.ErrorIs(t, r.UnmarshalText([]byte(s)), dlock.ErrInvalid, "%q", s)
	}
	bad := []dlock.HoldRef{
		{}, {Name: n, Kind: dlock.KindMutex, ID: good.ID},
		{Name: n, Kind: dlock.KindReentrant, ID: good.ID, Token: 7},
		{Name: "", Kind: dlock.KindMutex, ID: good.ID, Token: 7},
		{Name: n, Kind: dlock.KindMutex, ID: "a.b c", Token: 7},
		{Name: n, Kind: dlock.KindMutex, ID: ".x", Token: 7},
	}
	for _, r := range bad {
		assert.ErrorIs(t, c.ReleaseRef(ctx, r), dlock.ErrInvalid, "%+v", r)
		assert.ErrorIs(t, c.ExtendRef(ctx, r, time.Second), dlock.ErrInvalid, "%+v", r)
		_, err := r.MarshalText()
		assert.ErrorIs(t, err, dlock.ErrInvalid)
	}
	assert.ErrorIs(t, c.ExtendRef(ctx, good, 0), dlock.ErrInvalid)
	// A well-formed ref to a hold that never existed changes nothing.
	assert.ErrorIs(t, c.ReleaseRef(ctx, good), dlock.ErrNotHeld)
	locked, err := m.IsLocked(ctx)
	require.NoError(t, err)
	assert.True(t, locked)
	select {
	case <-m.Lost():
		t.Fatal("the hold was lost")
	default:
	}

	// A ref to another kind's key is refused, naming the key.
	r := c.ReentrantMutex(n+"-r", dlock.WithHandleOwner())
	require.NoError(t, r.Lock(ctx))
	defer r.Unlock(ctx)
	err = c.ReleaseRef(ctx, dlock.HoldRef{Name: n + "-r", Kind: dlock.KindMutex, ID: good.ID, Token: 7})
	assert.ErrorIs(t, err, dlock.ErrInvalid)
	held, err := r.IsLocked(ctx)
	require.NoError(t, err)
	assert.True(t, held)
}

// The text form survives names with spaces and separators, and JSON.
func TestHoldRef_TextRoundTrip(t *testing.T) {
	ref := dlock.HoldRef{Name: "orders: 42 | x", Kind: dlock.KindMutex, ID: "web-1:99~ABC.DEF", Token: 1234567}
	back, err := dlock.ParseHoldRef(ref.String())
	require.NoError(t, err)
	assert.Equal(t, ref, back)
	assert.True(t, strings.HasPrefix(ref.String(), "dlock1 mutex 1234567 "))
	b, err := json.Marshal(map[string]dlock.HoldRef{"ref": ref})
	require.NoError(t, err)
	var m map[string]dlock.HoldRef
	require.NoError(t, json.Unmarshal(b, &m))
	assert.Equal(t, ref, m["ref"])
}

func TestHandOver_NotHeldAndBadHandle(t *testing.T) {
	e := sharedEnv(t)
	c := e.client(e.rdb())
	_, err := c.Mutex(name(t)).HandOver()
	assert.ErrorIs(t, err, dlock.ErrNotHeld)
	_, err = c.Mutex("").HandOver()
	assert.ErrorIs(t, err, dlock.ErrInvalid)
	_, err = dlock.New(nil).Mutex("x").HandOver()
	assert.ErrorIs(t, err, dlock.ErrInvalid)
	ctx := ctxTimeout(t, 5*time.Second)
	ref := dlock.HoldRef{Name: "x", Kind: dlock.KindMutex, ID: "a.b", Token: 1}
	assert.ErrorIs(t, dlock.New(nil).ReleaseRef(ctx, ref), dlock.ErrInvalid)
	assert.ErrorIs(t, dlock.New(nil).ExtendRef(ctx, ref, time.Second), dlock.ErrInvalid)
}

// A Redlock hold lives on a quorum of masters: it is not handed over.
func TestHandOver_Redlock_ErrInvalid(t *testing.T) {
	e := sharedEnv(t)
	ctx := ctxTimeout(t, 5*time.Second)
	rdbs := []redis.UniversalClient{e.rdb()}
	for range 2 {
		rdbs = append(rdbs, realEnv(t).rdb())
	}
	r := dlock.NewRedlock(rdbs)
	t.Cleanup(func() { _ = r.Close() })
	m := r.Mutex(name(t))
	require.NoError(t, m.Lock(ctx))
	_, err := m.HandOver()
	assert.ErrorIs(t, err, dlock.ErrInvalid)
	require.NoError(t, m.Unlock(ctx), "a refused HandOver left the hold alone")
}

// A HoldRef built from Status releases that hold; its holder, which never
// handed it over, learns it lost the hold at its next renewal.
func TestHoldRef_FromStatus_ReleasesThatHoldAndItsHolderLearns(t *testing.T) {
	e := sharedEnv(t)
	ctx := ctxTimeout(t, 10*time.Second)
	holder := e.client(e.rdb(), dlock.WithWatchdogTimeout(300*time.Millisecond))
	ops := e.client(e.rdb())
	n := name(t)
	m := holder.Mutex(n)
	require.NoError(t, m.Lock(ctx))
	st, err := ops.Status(ctx, n)
	require.NoError(t, err)
	require.Len(t, st.Holders, 1)
	ref := dlock.HoldRef{Name: n, Kind: st.Kind, ID: st.Holders[0].ID, Token: st.Token}
	require.NoError(t, ops.ReleaseRef(ctx, ref))
	within(t, m.Lost(), 2*time.Second, "the holder's Lost after a release by ref")
	assert.ErrorIs(t, m.Unlock(ctx), dlock.ErrLost)
}
