package dlock

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock/internal/lease"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/wire"
)

// A ForceUnlock's notice names the holder it took the lock from and that
// hold's token: for a ReentrantMutex, the grant's ID. A notice with another
// token must not report the owner's hold lost (a cohort's local holds share
// their grant's ID; an RWMutex writer's owner ID outlives its holds). The
// notice with the hold's own token does.
func TestForcedNotice_ReentrantHold_LostOnlyWithItsOwnToken(t *testing.T) {
	c, r, ctx := subscribedOwner(t)
	require.NoError(t, r.Lock(ctx))
	token, lost, grant := r.Token(ctx), r.Lost(ctx), r.holdOf(ctx).Spec.ID
	notice := func(fence uint64) { publishForced(t, c, r.h.Channel, grant, fence) }

	acted := make(chan struct{}, 1)
	c.core.Hooks.AfterForcedNotice = func() { acted <- struct{}{} }
	notice(token - 1)
	select {
	case <-acted:
	case <-time.After(5 * time.Second):
		t.Fatal("the notice did not arrive")
	}
	select {
	case <-lost:
		t.Fatal("a notice of the owner's earlier hold reported its current hold lost")
	default:
	}
	notice(token)
	select {
	case <-lost:
	case <-time.After(2 * time.Second):
		t.Fatal("the notice with the hold's token did not report it lost")
	}
	require.ErrorIs(t, r.Unlock(ctx), ErrLost)
}

// publishForced publishes a ForceUnlock's notice (excl_force's) that names
// the holder id with token on channel.
func publishForced(t *testing.T, c *Client, channel, id string, token uint64) {
	t.Helper()
	m := wire.Release{From: "elsewhere", Wake: wire.Wake{N: 1, Kind: wire.KindReleased, IDs: []string{id}, Fence: token}}
	require.NoError(t, c.core.RDB.Publish(context.Background(), channel, m.Encode()).Err())
}

// A ForceUnlock's notice that arrives after a ReentrantMutex grant and
// before its Lock records it for the owner (the notice's look for the
// grant's holds misses it) still reports the hold lost, as the Lock
// records it: the owner learns at once, not at its next renewal.
func TestForcedNotice_ReentrantGrantNotYetRecorded_LostAsItIsRecorded(t *testing.T) {
	c, r, ctx := subscribedOwner(t)
	acted := make(chan struct{}, 1)
	c.core.Hooks.AfterForcedNotice = func() { acted <- struct{}{} }
	c.core.Hooks.BeforeRecordGrant = func(l *lease.Hold) {
		publishForced(t, c, r.h.Channel, l.Spec.ID, l.Token)
		select {
		case <-acted:
		case <-time.After(5 * time.Second):
			t.Error("the notice did not arrive")
		}
	}
	require.NoError(t, r.Lock(ctx))
	select {
	case <-r.Lost(ctx):
	default:
		t.Fatal("the forced grant was recorded as held")
	}
	require.ErrorIs(t, r.Unlock(ctx), ErrLost)
}

// subscribedOwner returns a Client subscribed to the channel of a
// ReentrantMutex named after the test, the lock, and a context of owner
// "one".
func subscribedOwner(t *testing.T) (*Client, *ReentrantMutex, context.Context) {
	t.Helper()
	srv := redistest.Start(t)
	c := New(srv.NewClient(t))
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(WithOwner(context.Background(), "one"), 20*time.Second)
	t.Cleanup(cancel)
	subscribed(t, c, c.Mutex(t.Name()))
	return c, c.ReentrantMutex(t.Name()), ctx
}
