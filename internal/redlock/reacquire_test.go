package redlock

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock/internal/engine"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/telemetry"
	"github.com/dlock-go/dlock/internal/wire"
)

// A re-acquire on a master that lost the key, sent just before Unlock
// released the hold, must not leave the key there once both are done.
func TestRedlock_ReacquireRacingUnlock_LeavesNoKey(t *testing.T) {
	var rdbs []redis.UniversalClient
	var srvs []*redistest.Server
	for range 3 {
		s := redistest.Real(t)
		srvs = append(srvs, s)
		rdb := redis.NewClient(&redis.Options{Addr: s.Addr, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = rdb.Close() })
		rdbs = append(rdbs, rdb)
	}
	reached, proceed := make(chan struct{}), make(chan struct{})
	var once sync.Once
	hook := func() {
		once.Do(func() {
			close(reached)
			<-proceed
		})
	}
	reacquireHook.Store(&hook)
	t.Cleanup(func() { reacquireHook.Store(nil) })
	cfg := engine.Config{Prefix: "dlock:", Watchdog: 600 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)}
	r := New(rdbs, cfg, telemetry.New(nil, nil, false), wire.NewClientID("test"), nil)
	t.Cleanup(func() { _ = r.Close() })
	h := r.Core.NewHandle(telemetry.KindMutex, t.Name(), 0, 0, nil)
	slot := &engine.Slot{}
	m := r.NewMutex(h, slot)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	ok, err := m.Acquire(ctx, "lock", true)
	require.NoError(t, err)
	require.True(t, ok)
	require.Eventually(t, func() bool { // Lock returns on a quorum
		v, err := srvs[0].Do(ctx, "hget", h.Key, "o")
		return err == nil && v == slot.Get().Spec.ID
	}, time.Second, 5*time.Millisecond)
	_, err = srvs[0].Do(ctx, "del", h.Key) // master 0 lost the key
	require.NoError(t, err)
	select {
	case <-reached: // a renewal found it gone; its re-acquire is about to go
	case <-ctx.Done():
		t.Fatal("no re-acquire")
	}
	require.NoError(t, m.Release(ctx, slot.Take(), "unlock"))
	close(proceed)
	time.Sleep(100 * time.Millisecond) // the re-acquire, and what follows it
	require.NoError(t, r.Close())
	_, err = srvs[0].Do(ctx, "hget", h.Key, "o")
	require.True(t, errors.Is(err, redis.Nil), "master 0 still has a holder after Unlock (err %v)", err)
}
