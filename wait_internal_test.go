package dlock

import (
	"github.com/dlock-go/dlock/internal/wire"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func pending(w *waiter) (wakeReason, bool) {
	select {
	case r := <-w.wake:
		return r, true
	default:
		return 0, false
	}
}

func TestWaitRegistry_OneReleaseWakesOldestWaiterOnly(t *testing.T) {
	var r waitRegistry
	r.init()
	w1, err := r.join("ch", waitAs{})
	require.NoError(t, err)
	w2, err := r.join("ch", waitAs{})
	require.NoError(t, err)

	r.wake("ch", wire.WakeOne, wakeRelease)
	got, ok := pending(w1)
	assert.True(t, ok)
	assert.Equal(t, wakeRelease, got)
	_, ok = pending(w2)
	assert.False(t, ok, "one release wakes one waiter")

	// A second release while w1 has not acted yet goes to the next waiter.
	r.wake("ch", wire.WakeOne, wakeRelease)
	_, ok = pending(w2)
	assert.True(t, ok)
}

func TestWaitRegistry_WokenWaiterLeavingWithoutLock_PassesWakeOn(t *testing.T) {
	var r waitRegistry
	r.init()
	w1, _ := r.join("ch", waitAs{})
	w2, _ := r.join("ch", waitAs{})
	r.wake("ch", wire.WakeOne, wakeRelease)
	r.leave(w1, false) // cancelled before retrying
	_, ok := pending(w2)
	assert.True(t, ok, "the wake-up must not be swallowed")

	w3, _ := r.join("ch", waitAs{})
	r.attempt(w2)
	r.leave(w2, true) // acquired: the wake-up was used
	_, ok = pending(w3)
	assert.False(t, ok)
	r.leave(w3, false)
	assert.Zero(t, r.count.Load())
	assert.Empty(t, r.queues, "an empty queue is removed")
}

func TestWaitRegistry_SubscriptionConfirmedWakesEveryone(t *testing.T) {
	var r waitRegistry
	r.init()
	ws := make([]*waiter, 5)
	for i := range ws {
		ws[i], _ = r.join("ch", waitAs{})
	}
	other, _ := r.join("other", waitAs{})
	r.wake("ch", wire.Wake{}, wakeSubscribed)
	for _, w := range ws {
		got, ok := pending(w)
		assert.True(t, ok)
		assert.Equal(t, wakeSubscribed, got)
	}
	_, ok := pending(other)
	assert.False(t, ok)
	r.close()
	got, _ := pending(other)
	assert.Equal(t, wakeClosed, got)
	_, err := r.join("ch", waitAs{})
	assert.ErrorIs(t, err, ErrClosed)
}

func TestWaitRegistry_KindAndIDWakeOnlyThoseNamed(t *testing.T) {
	var r waitRegistry
	r.init()
	w1, _ := r.join("ch", waitAs{kind: wire.KindWriter})
	r1, _ := r.join("ch", waitAs{kind: wire.KindReader})
	r2, _ := r.join("ch", waitAs{kind: wire.KindReader})
	r.wake("ch", wire.Wake{Kind: wire.KindReader}, wakeRelease)
	_, ok := pending(w1)
	assert.False(t, ok, "a reader wake-up skips writers")
	_, ok1 := pending(r1)
	_, ok2 := pending(r2)
	assert.True(t, ok1 && ok2, "all readers woken")

	s1, _ := r.join("ch", waitAs{id: "S1"})
	s2, _ := r.join("ch", waitAs{id: "S2"})
	r.wake("ch", wire.Wake{IDs: []string{"S2", "unknown"}}, wakeRelease)
	_, ok = pending(s1)
	assert.False(t, ok)
	_, ok = pending(s2)
	assert.True(t, ok)
	for _, w := range []*waiter{w1, r1, r2, s1, s2} {
		r.leave(w, true)
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
	var r waitRegistry
	r.init()
	w, err := r.join("ch", waitAs{id: "T1"})
	require.NoError(t, err)
	r.close()
	r.wake("ch", wire.Wake{Kind: wire.KindHanded, IDs: []string{"T1"}}, wakeRelease)
	got, ok := pending(w)
	assert.True(t, ok)
	assert.Equal(t, wakeClosed, got)
}

func TestWaitRegistry_HandedReplacesAnOrdinaryWakeUp(t *testing.T) {
	var r waitRegistry
	r.init()
	w, err := r.join("ch", waitAs{id: "T1"})
	require.NoError(t, err)
	r.wake("ch", wire.WakeOne, wakeSubscribed)
	r.wake("ch", wire.Wake{Kind: wire.KindHanded, IDs: []string{"T1"}}, wakeRelease)
	got, ok := pending(w)
	assert.True(t, ok)
	assert.Equal(t, wakeHanded, got, "the waiter learns it holds the lock, not merely to look again")
}
