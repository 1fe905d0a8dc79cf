package dlock

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/wire"
)

// A ForceUnlock's notice names the holder it took the lock from and that
// hold's token. An owner's ID outlives its holds, so a notice that arrives
// after the owner holds again (pub/sub and replies travel on different
// connections) names the same ID with an older token: it must not report
// the owner's new hold lost. The notice with the hold's own token does.
func TestForcedNotice_CountedHold_LostOnlyWithItsOwnToken(t *testing.T) {
	srv := redistest.Start(t)
	c := New(srv.NewClient(t))
	defer c.Close()
	ctx, cancel := context.WithTimeout(WithOwner(context.Background(), "one"), 20*time.Second)
	defer cancel()
	r := c.ReentrantMutex(t.Name())
	subscribed(t, c, c.Mutex(t.Name()))
	require.NoError(t, r.Lock(ctx))
	token, lost := r.Token(ctx), r.Lost(ctx)
	notice := func(fence uint64) {
		m := wire.Release{From: "elsewhere", Wake: wire.Wake{N: 1, Kind: wire.KindReleased, IDs: []string{wire.OwnerID(c.core.ID, "one")}, Fence: fence}}
		require.NoError(t, c.core.RDB.Publish(ctx, r.h.Channel, m.Encode()).Err())
	}

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
