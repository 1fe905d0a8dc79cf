package wait

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/wire"
)

func pending(w *Waiter) (Reason, bool) {
	select {
	case r := <-w.wake:
		return r, true
	default:
		return 0, false
	}
}

func TestWaitRegistry_OneReleaseWakesOldestWaiterOnly(t *testing.T) {
	var r Registry
	r.init()
	w1, err := r.Join("ch", As{})
	require.NoError(t, err)
	w2, err := r.Join("ch", As{})
	require.NoError(t, err)

	r.Wake("ch", wire.WakeOne, WakeRelease)
	got, ok := pending(w1)
	assert.True(t, ok)
	assert.Equal(t, WakeRelease, got)
	_, ok = pending(w2)
	assert.False(t, ok, "one release wakes one waiter")

	// A second release while w1 has not acted yet goes to the next waiter.
	r.Wake("ch", wire.WakeOne, WakeRelease)
	_, ok = pending(w2)
	assert.True(t, ok)
}

func TestWaitRegistry_WokenWaiterLeavingWithoutLock_PassesWakeOn(t *testing.T) {
	var r Registry
	r.init()
	w1, _ := r.Join("ch", As{})
	w2, _ := r.Join("ch", As{})
	r.Wake("ch", wire.WakeOne, WakeRelease)
	r.Leave(w1, false) // cancelled before retrying
	_, ok := pending(w2)
	assert.True(t, ok, "the wake-up must not be swallowed")

	w3, _ := r.Join("ch", As{})
	r.Attempt(w2)
	r.Leave(w2, true) // acquired: the wake-up was used
	_, ok = pending(w3)
	assert.False(t, ok)
	r.Leave(w3, false)
	assert.Zero(t, r.count.Load())
	assert.Empty(t, r.queues, "an empty queue is removed")
}

func TestWaitRegistry_SubscriptionConfirmedWakesEveryone(t *testing.T) {
	var r Registry
	r.init()
	ws := make([]*Waiter, 5)
	for i := range ws {
		ws[i], _ = r.Join("ch", As{})
	}
	other, _ := r.Join("other", As{})
	r.Wake("ch", wire.Wake{}, WakeSubscribed)
	for _, w := range ws {
		got, ok := pending(w)
		assert.True(t, ok)
		assert.Equal(t, WakeSubscribed, got)
	}
	_, ok := pending(other)
	assert.False(t, ok)
	r.Close()
	got, _ := pending(other)
	assert.Equal(t, WakeClosed, got)
	_, err := r.Join("ch", As{})
	assert.ErrorIs(t, err, errs.ErrClosed)
}

func TestWaitRegistry_KindAndIDWakeOnlyThoseNamed(t *testing.T) {
	var r Registry
	r.init()
	w1, _ := r.Join("ch", As{Kind: wire.KindWriter})
	r1, _ := r.Join("ch", As{Kind: wire.KindReader})
	r2, _ := r.Join("ch", As{Kind: wire.KindReader})
	r.Wake("ch", wire.Wake{Kind: wire.KindReader}, WakeRelease)
	_, ok := pending(w1)
	assert.False(t, ok, "a reader wake-up skips writers")
	_, ok1 := pending(r1)
	_, ok2 := pending(r2)
	assert.True(t, ok1 && ok2, "all readers woken")

	s1, _ := r.Join("ch", As{ID: "S1"})
	s2, _ := r.Join("ch", As{ID: "S2"})
	r.Wake("ch", wire.Wake{IDs: []string{"S2", "unknown"}}, WakeRelease)
	_, ok = pending(s1)
	assert.False(t, ok)
	_, ok = pending(s2)
	assert.True(t, ok)
	for _, w := range []*Waiter{w1, r1, r2, s1, s2} {
		r.Leave(w, true)
	}
	assert.Empty(t, r.byID)
}

func TestSlot_MatchesRedisClusterHashTags(t *testing.T) {
	// The examples of the CLUSTER KEYSLOT documentation.
	assert.Equal(t, uint16(11058), wire.Slot("somekey"))
	assert.Equal(t, uint16(2515), wire.Slot("foo{hash_tag}"))
	assert.Equal(t, wire.Slot("hash_tag"), wire.Slot("foo{hash_tag}"))
	assert.Equal(t, wire.Slot("bar"), wire.Slot("dlock:{bar}"))
	assert.Equal(t, wire.Slot("dlock:{bar}"), wire.Slot("dlock:{bar}:ch"))
	assert.NotEqual(t, wire.Slot("x{}y"), wire.Slot("x{}y:ch"), "an empty tag hashes the whole key")
}

// Review finding: a hand-over arriving just as the Client closes replaced the
// pending wakeClosed, so Lock could succeed while Close was under way.
func TestWaitRegistry_HandedNeverReplacesClosed(t *testing.T) {
	var r Registry
	r.init()
	w, err := r.Join("ch", As{ID: "T1"})
	require.NoError(t, err)
	r.Close()
	r.Wake("ch", wire.Wake{Kind: wire.KindHanded, IDs: []string{"T1"}}, WakeRelease)
	got, ok := pending(w)
	assert.True(t, ok)
	assert.Equal(t, WakeClosed, got)
}

func TestWaitRegistry_HandedReplacesAnOrdinaryWakeUp(t *testing.T) {
	var r Registry
	r.init()
	w, err := r.Join("ch", As{ID: "T1"})
	require.NoError(t, err)
	r.Wake("ch", wire.WakeOne, WakeSubscribed)
	r.Wake("ch", wire.Wake{Kind: wire.KindHanded, IDs: []string{"T1"}}, WakeRelease)
	got, ok := pending(w)
	assert.True(t, ok)
	assert.Equal(t, WakeHanded, got, "the waiter learns it holds the lock, not merely to look again")
}

// Found by the torture suite (seed 1126, an Election term with token 0): a
// waiter handed the lock, whose mark's renewal then found its place gone
// before it woke, was woken once more by ID without a token (the mark's
// place-gone callback). That wake-up kept the pending hand-over but
// overwrote its token with 0, so the waiter took the lock with token 0.
func TestWaitRegistry_WakeByIDWithoutTokenKeepsTheHandedToken(t *testing.T) {
	var r Registry
	r.init()
	w, err := r.Join("ch", As{ID: "T1"})
	require.NoError(t, err)
	r.Wake("ch", wire.Wake{Kind: wire.KindHanded, IDs: []string{"T1"}, Fence: 42}, WakeLocal)
	r.Wake("ch", wire.Wake{IDs: []string{"T1"}}, WakeLocal) // the place is gone
	got, ok := pending(w)
	assert.True(t, ok)
	assert.Equal(t, WakeHanded, got)
	assert.Equal(t, uint64(42), r.HandedToken(w), "the hand-over's token")
}

func TestWaitRegistry_HandedToOwner_ItsWaitersClaimIt(t *testing.T) {
	var r Registry
	r.init()
	a1, _ := r.Join("ch", As{Owner: "c.o.a", Kind: wire.KindReader})
	a2, _ := r.Join("ch", As{Owner: "c.o.a", Kind: wire.KindReader})
	aw, _ := r.Join("ch", As{ID: "c.g1", Owner: "c.o.a", Kind: wire.KindWriter})
	other, _ := r.Join("ch", As{Owner: "c.o.z", Kind: wire.KindReader})
	r.Wake("ch", wire.Wake{Kind: wire.KindHanded, IDs: []string{"c.o.a"}}, WakeLocal)
	for _, w := range []*Waiter{a1, a2} {
		got, ok := pending(w)
		require.True(t, ok)
		assert.Equal(t, WakeLocal, got, "a reader's hand-over is claimed with a try")
	}
	_, ok := pending(aw)
	assert.False(t, ok, "the owner's write call is not woken by a read handed to it")
	_, ok = pending(other)
	assert.False(t, ok, "another owner's waiter is not woken")
}

func TestWaitRegistry_Took_WakesTheOwnersWaiters(t *testing.T) {
	var r Registry
	r.init()
	w, _ := r.Join("ch", As{Owner: "c.o.a"})
	x, _ := r.Join("ch", As{Owner: "c.o.x"})
	r.Took("ch", "c.o.a")
	got, ok := pending(w)
	require.True(t, ok, "the owner's waiters re-enter")
	assert.Equal(t, WakeLocal, got)
	assert.True(t, r.OwnerHolds(w))
	_, ok = pending(x)
	assert.False(t, ok, "another owner's waiter is not woken")
	assert.False(t, r.OwnerHolds(x))
}

func TestWaitRegistry_OwnerWaiterLeavingWoken_PassesToTheSameOwner(t *testing.T) {
	var r Registry
	r.init()
	w1, _ := r.Join("ch", As{Owner: "c.o.a"})
	x, _ := r.Join("ch", As{Owner: "c.o.x"})
	w2, _ := r.Join("ch", As{Owner: "c.o.a"})
	r.Wake("ch", wire.WakeOne, WakeRelease) // the oldest: w1
	_, ok := pending(w1)
	require.True(t, ok)
	r.Leave(w1, false)
	_, ok = pending(w2)
	assert.True(t, ok, "the owner's other waiter gets the wake-up: it may be a hand-over to the owner")
	_, ok = pending(x)
	assert.False(t, ok)
}

// A cohort's release queues the local waiters it took from the registry and
// then takes out the places of those that gave up meanwhile. One that left
// because it acquired (its own try found the lock handed to it) keeps its
// hold: cancelling its place passed the lock on to the next waiter while it
// held, two holders at once (TestMutexCohort_OtherClientServedWithinBound
// saw tokens out of order, 3 runs in 30).
func TestWaitRegistry_WakeEnded_GivesBackOnlyThePlacesOfWaitersThatGaveUp(t *testing.T) {
	var r Registry
	r.init()
	acquired, err := r.Join("ch", As{ID: "A", Place: "0:A"})
	require.NoError(t, err)
	gaveUp, err := r.Join("ch", As{ID: "G", Place: "0:G"})
	require.NoError(t, err)
	r.Leave(acquired, true)
	r.Leave(gaveUp, false)
	assert.Equal(t, []string{"0:G"}, r.WakeEnded([]*Waiter{acquired, gaveUp}, true, time.Now()))
}
