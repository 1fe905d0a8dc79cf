package dlock

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock/internal/faultnet"
	"github.com/dlock-go/dlock/internal/redistest"
)

// An Observe keeps two places in its Client's registry of waiters (see
// Election.observe). Neither ever takes a wake-up meant for a campaigner of
// the same Client: not a release's counted one, nor one that a waiter
// leaving passes on. This pins the registry's rule that observe relies on:
// a waiter stays woken, and counted wake-ups skip it, until it acts on its
// wake-ups (waitRegistry.attempt).
func TestObserve_ItsPlacesInTheRegistry_NeverTakeACampaignersWakeUp(t *testing.T) {
	srv := redistest.Start(t)
	proxy, err := faultnet.Start(srv.Addr)
	require.NoError(t, err)
	defer proxy.Close()
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr})
	defer rdb.Close()
	c := New(rdb)
	defer c.Close()
	e := c.Election("observed")
	ch := e.m.channel
	ctx, stop := context.WithCancel(context.Background())
	// Cut off, the observer's subscription cannot be confirmed: the places
	// are as they are before the confirmation, which would wake both.
	proxy.Partition()
	seen := e.Observe(ctx)

	// Both places joined, the one for the subscription's confirmations woken
	// for good.
	require.Eventually(t, func() bool {
		c.waits.mu.Lock()
		defer c.waits.mu.Unlock()
		q := c.waits.queues[ch]
		if q == nil || q.head == nil || q.head.next == nil {
			return false
		}
		return q.head.next.kind != kindObserver && q.head.next.woken
	}, 2*time.Second, time.Millisecond,
		"the observer's place for confirmations is not woken before its first confirmation: counted wake-ups can take it")

	first, err := c.waits.join(ch, waitAs{id: "campaigner-1"})
	require.NoError(t, err)
	second, err := c.waits.join(ch, waitAs{id: "campaigner-2"})
	require.NoError(t, err)
	for range 3 { // whatever the observer does meanwhile
		time.Sleep(10 * time.Millisecond)
		c.waits.wake(ch, wakeOne, wakeRelease)
		_, ok := pending(first)
		assert.True(t, ok, "a release's wake-up went to the observer's places, not the first campaigner")
		c.waits.attempt(first)
	}
	c.waits.wake(ch, wakeOne, wakeRelease)
	c.waits.leave(first, false) // gives up before it looks: passes the wake-up on
	_, ok := pending(second)
	assert.True(t, ok, "a wake-up passed on went to the observer's places, not the next campaigner")
	c.waits.leave(second, true)

	proxy.Heal()
	stop()
	for range seen {
	}
	c.waits.mu.Lock()
	defer c.waits.mu.Unlock()
	assert.Nil(t, c.waits.queues[ch], "the observer left the registry")
}
