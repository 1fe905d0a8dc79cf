package wait

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock/internal/wire"
)

// An Observe waits in its Client's registry as an observer (see
// Election.observe). The registry's rule it relies on: an observer never
// takes a wake-up meant for a campaigner (a release's counted one, one a
// waiter leaving passes on, a release's wake-all), but takes its own
// notices, the subscription's confirmations (a notice may have been missed
// before them) and the Client's close, which attempt never consumes.
func TestWaitRegistry_Observer_TakesNoticesConfirmationsAndCloseOnly(t *testing.T) {
	var r Registry
	r.init()
	obs, err := r.Join("ch", As{Kind: wire.KindObserver})
	require.NoError(t, err)
	first, _ := r.Join("ch", As{ID: "campaigner-1"})
	second, _ := r.Join("ch", As{ID: "campaigner-2"})

	r.Wake("ch", wire.WakeOne, WakeRelease)
	_, ok := pending(first)
	assert.True(t, ok, "a release's wake-up goes to the first campaigner")
	r.Wake("ch", wire.WakeOne, WakeRelease)
	r.Leave(first, false) // leaves before it looks: passes the wake-up on
	_, ok = pending(second)
	assert.True(t, ok, "a wake-up passed on goes to the next campaigner")
	r.Attempt(second)
	r.Wake("ch", wire.WakeAll, WakeLocal)
	_, ok = pending(obs)
	assert.False(t, ok, "the observer took a campaigner's wake-up")

	r.Wake("ch", wire.WakeAll, WakeSubscribed)
	why, ok := pending(obs)
	assert.True(t, ok && why == WakeSubscribed, "a subscription's confirmation must reach the observer")
	r.Attempt(obs)
	r.Wake("ch", wire.Wake{Kind: wire.KindObserver}, WakeRelease)
	why, ok = pending(obs)
	assert.True(t, ok && why == WakeRelease, "a new leader's notice must reach the observer")

	r.Close()
	r.Attempt(obs)
	why, ok = pending(obs)
	assert.True(t, ok && why == WakeClosed, "the Client's close must stay for the observer to see")
}
