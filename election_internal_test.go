package dlock

import (
	"github.com/dlock-go/dlock/internal/wire"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An Observe waits in its Client's registry as an observer (see
// Election.observe). The registry's rule it relies on: an observer never
// takes a wake-up meant for a campaigner (a release's counted one, one a
// waiter leaving passes on, a release's wake-all), but takes its own
// notices, the subscription's confirmations (a notice may have been missed
// before them) and the Client's close, which attempt never consumes.
func TestWaitRegistry_Observer_TakesNoticesConfirmationsAndCloseOnly(t *testing.T) {
	var r waitRegistry
	r.init()
	obs, err := r.join("ch", waitAs{kind: wire.KindObserver})
	require.NoError(t, err)
	first, _ := r.join("ch", waitAs{id: "campaigner-1"})
	second, _ := r.join("ch", waitAs{id: "campaigner-2"})

	r.wake("ch", wire.WakeOne, wakeRelease)
	_, ok := pending(first)
	assert.True(t, ok, "a release's wake-up goes to the first campaigner")
	r.wake("ch", wire.WakeOne, wakeRelease)
	r.leave(first, false) // leaves before it looks: passes the wake-up on
	_, ok = pending(second)
	assert.True(t, ok, "a wake-up passed on goes to the next campaigner")
	r.attempt(second)
	r.wake("ch", wire.WakeAll, wakeLocal)
	_, ok = pending(obs)
	assert.False(t, ok, "the observer took a campaigner's wake-up")

	r.wake("ch", wire.WakeAll, wakeSubscribed)
	why, ok := pending(obs)
	assert.True(t, ok && why == wakeSubscribed, "a subscription's confirmation must reach the observer")
	r.attempt(obs)
	r.wake("ch", wire.Wake{Kind: wire.KindObserver}, wakeRelease)
	why, ok = pending(obs)
	assert.True(t, ok && why == wakeRelease, "a new leader's notice must reach the observer")

	r.close()
	r.attempt(obs)
	why, ok = pending(obs)
	assert.True(t, ok && why == wakeClosed, "the Client's close must stay for the observer to see")
}
