package dlock

import (
	"testing"
	"time"

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

	r.wake("ch", wakeOne, wakeRelease)
	got, ok := pending(w1)
	assert.True(t, ok)
	assert.Equal(t, wakeRelease, got)
	_, ok = pending(w2)
	assert.False(t, ok, "one release wakes one waiter")

	// A second release while w1 has not acted yet goes to the next waiter.
	r.wake("ch", wakeOne, wakeRelease)
	_, ok = pending(w2)
	assert.True(t, ok)
}

func TestWaitRegistry_WokenWaiterLeavingWithoutLock_PassesWakeOn(t *testing.T) {
	var r waitRegistry
	r.init()
	w1, _ := r.join("ch", waitAs{})
	w2, _ := r.join("ch", waitAs{})
	r.wake("ch", wakeOne, wakeRelease)
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
	r.wake("ch", wakeSpec{}, wakeSubscribed)
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

func TestReleaseMsg_DecodesWhatScriptsPublish(t *testing.T) {
	m := decodeRelease(wakeOneMsg("ABC"))
	assert.Equal(t, "ABC", m.from)
	assert.Equal(t, wakeOne, m.wake)
	assert.Equal(t, wakeSpec{n: 0, kind: kindReader}, decodeRelease("ABC|0|r").wake)
	assert.Equal(t, wakeSpec{n: 2, ids: []string{"X1", "Y2"}}, decodeRelease("ABC|2||X1,Y2").wake)
	assert.Equal(t, wakeSpec{n: 1, kind: kindHanded, ids: []string{"T"}}, decodeRelease("ABC|1|g|T").wake)
	m = decodeRelease("garbage")
	assert.Equal(t, "garbage", m.from)
	assert.Equal(t, wakeOne, m.wake)
}

func TestReleaseMsg_EncodeRoundTrips(t *testing.T) {
	for _, m := range []releaseMsg{
		{from: "A", wake: wakeOne},
		{from: "A", wake: wakeSpec{n: 0, kind: kindWriter}},
		{from: "A", wake: wakeSpec{n: 0, ids: []string{"X", "Y"}}},
		{from: "A", wake: wakeSpec{n: 1, kind: kindHanded, ids: []string{"T"}}},
		{from: "A", wake: wakeSpec{n: 1, kind: kindHanded, ids: []string{"T", "U"}, fence: 1795443186107935, ttl: 2500 * time.Millisecond}},
	} {
		assert.Equal(t, m, decodeRelease(m.encode()), m.encode())
	}
	assert.Equal(t, "A|1", releaseMsg{from: "A", wake: wakeOne}.encode(), "the short form scripts publish")
}

func TestWaitRegistry_KindAndIDWakeOnlyThoseNamed(t *testing.T) {
	var r waitRegistry
	r.init()
	w1, _ := r.join("ch", waitAs{kind: kindWriter})
	r1, _ := r.join("ch", waitAs{kind: kindReader})
	r2, _ := r.join("ch", waitAs{kind: kindReader})
	r.wake("ch", wakeSpec{kind: kindReader}, wakeRelease)
	_, ok := pending(w1)
	assert.False(t, ok, "a reader wake-up skips writers")
	_, ok1 := pending(r1)
	_, ok2 := pending(r2)
	assert.True(t, ok1 && ok2, "all readers woken")

	s1, _ := r.join("ch", waitAs{id: "S1"})
	s2, _ := r.join("ch", waitAs{id: "S2"})
	r.wake("ch", wakeSpec{ids: []string{"S2", "unknown"}}, wakeRelease)
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
	assert.Equal(t, uint16(11058), slot("somekey"))
	assert.Equal(t, uint16(2515), slot("foo{hash_tag}"))
	assert.Equal(t, slot("hash_tag"), slot("foo{hash_tag}"))
	assert.Equal(t, slot("bar"), slot("dlock:{bar}"))
	assert.Equal(t, slot("dlock:{bar}"), slot("dlock:{bar}:ch"))
	assert.NotEqual(t, slot("x{}y"), slot("x{}y:ch"), "an empty tag hashes the whole key")
}

// Review finding: a hand-over arriving just as the Client closes replaced the
// pending wakeClosed, so Lock could succeed while Close was under way.
func TestWaitRegistry_HandedNeverReplacesClosed(t *testing.T) {
	var r waitRegistry
	r.init()
	w, err := r.join("ch", waitAs{id: "T1"})
	require.NoError(t, err)
	r.close()
	r.wake("ch", wakeSpec{kind: kindHanded, ids: []string{"T1"}}, wakeRelease)
	got, ok := pending(w)
	assert.True(t, ok)
	assert.Equal(t, wakeClosed, got)
}

func TestWaitRegistry_HandedReplacesAnOrdinaryWakeUp(t *testing.T) {
	var r waitRegistry
	r.init()
	w, err := r.join("ch", waitAs{id: "T1"})
	require.NoError(t, err)
	r.wake("ch", wakeOne, wakeSubscribed)
	r.wake("ch", wakeSpec{kind: kindHanded, ids: []string{"T1"}}, wakeRelease)
	got, ok := pending(w)
	assert.True(t, ok)
	assert.Equal(t, wakeHanded, got, "the waiter learns it holds the lock, not merely to look again")
}
