package pubsub_test

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dlock-go/dlock/internal/faultnet"
	"github.com/dlock-go/dlock/internal/pubsub"
	"github.com/dlock-go/dlock/internal/redistest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

type recorder struct {
	mu         sync.Mutex
	messages   []string
	subscribed map[string]int
	signal     chan struct{}
}

func newRecorder() *recorder {
	return &recorder{subscribed: map[string]int{}, signal: make(chan struct{}, 100)}
}

func (r *recorder) Message(channel, payload string) {
	r.mu.Lock()
	r.messages = append(r.messages, channel+"="+payload)
	r.mu.Unlock()
	r.signal <- struct{}{}
}

func (r *recorder) Subscribed(channel string) {
	r.mu.Lock()
	r.subscribed[channel]++
	r.mu.Unlock()
	r.signal <- struct{}{}
}

func (r *recorder) confirmations(channel string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.subscribed[channel]
}

func numsub(t *testing.T, srv *redistest.Server, channel string) int64 {
	t.Helper()
	rdb := srv.NewClient(t)
	m, err := rdb.PubSubNumSub(context.Background(), channel).Result()
	require.NoError(t, err)
	return m[channel]
}

func TestHub_RefcountedChannel_SubscribedOnceUnsubscribedAfterLinger(t *testing.T) {
	srv := redistest.Real(t)
	rec := newRecorder()
	hub := pubsub.New(srv.NewClient(t), rec, pubsub.Options{Linger: 200 * time.Millisecond, PingInterval: 300 * time.Millisecond})
	defer hub.Close()
	ctx := context.Background()

	confirmed, err := hub.Acquire(ctx, "a")
	require.NoError(t, err)
	assert.False(t, confirmed, "first Acquire subscribes")
	require.Eventually(t, func() bool { return rec.confirmations("a") == 1 }, 2*time.Second, 5*time.Millisecond)
	confirmed, err = hub.Acquire(ctx, "a")
	require.NoError(t, err)
	assert.True(t, confirmed, "second Acquire reuses the confirmed subscription")
	assert.EqualValues(t, 1, numsub(t, srv, "a"))

	require.NoError(t, srv.NewClient(t).Publish(ctx, "a", "hello").Err())
	require.Eventually(t, func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return len(rec.messages) == 1 && rec.messages[0] == "a=hello"
	}, 2*time.Second, 5*time.Millisecond)

	hub.Release("a")
	hub.Release("a")
	assert.Equal(t, 1, hub.Channels(), "lingers after the last Release")
	require.Eventually(t, func() bool { return numsub(t, srv, "a") == 0 }, 3*time.Second, 20*time.Millisecond)
	assert.Zero(t, hub.Channels())
}

func TestHub_ConnectionKilled_ResubscribesAndReportsIt(t *testing.T) {
	srv := redistest.Real(t)
	rec := newRecorder()
	hub := pubsub.New(srv.NewClient(t), rec, pubsub.Options{PingInterval: 300 * time.Millisecond})
	defer hub.Close()
	ctx := context.Background()
	_, err := hub.Acquire(ctx, "b")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return rec.confirmations("b") == 1 }, 2*time.Second, 5*time.Millisecond)

	_, err = srv.Do(ctx, "client", "kill", "type", "pubsub")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return rec.confirmations("b") == 2 }, 5*time.Second, 5*time.Millisecond,
		"a re-subscription is reported after the kill")
	assert.EqualValues(t, 1, numsub(t, srv, "b"))
	hub.Release("b")
}

func TestHub_Close_AcquireFailsAndReaderStops(t *testing.T) {
	srv := redistest.Real(t)
	hub := pubsub.New(srv.NewClient(t), newRecorder(), pubsub.Options{})
	_, err := hub.Acquire(context.Background(), "c")
	require.NoError(t, err)
	require.NoError(t, hub.Close())
	_, err = hub.Acquire(context.Background(), "c")
	assert.ErrorIs(t, err, pubsub.ErrClosed)
}

// Quiet holds from a subscription's confirmation on, until something is
// noted on the channel or its connection fails: a connection that broke
// and has not been confirmed again since cannot vouch for what was
// published meanwhile. (go-redis reconnects inside the read that failed:
// while a reconnect hangs, as into a partition, the hub has not heard of
// the break; see Quiet.)
func TestHub_Quiet_FromConfirmationUntilNoteOrBreak(t *testing.T) {
	srv := redistest.Real(t)
	proxy, err := faultnet.Start(srv.Addr)
	require.NoError(t, err)
	defer proxy.Close()
	rec := newRecorder()
	hub := pubsub.New(redis.NewClient(&redis.Options{Addr: proxy.Addr, MaxRetries: -1}), rec, pubsub.Options{PingInterval: 300 * time.Millisecond})
	defer hub.Close()
	ctx := context.Background()

	before := time.Now()
	assert.False(t, hub.Quiet("q", before), "not subscribed")
	_, err = hub.Acquire(ctx, "q")
	require.NoError(t, err)
	defer hub.Release("q")
	require.Eventually(t, func() bool { return rec.confirmations("q") == 1 }, 2*time.Second, 5*time.Millisecond)
	assert.False(t, hub.Quiet("q", before), "subscribed only after that time")
	t1 := time.Now()
	assert.True(t, hub.Quiet("q", t1), "subscribed before, nothing noted")

	hub.Note("q")
	assert.False(t, hub.Quiet("q", t1), "noted since")
	t2 := time.Now()
	assert.True(t, hub.Quiet("q", t2), "noted before")
	hub.Note("other") // not subscribed: nothing to note
	assert.False(t, hub.Quiet("other", t2))

	proxy.Close() // the connection breaks, and every reconnect fails
	require.Eventually(t, func() bool { return !hub.Quiet("q", t2) }, 5*time.Second, time.Millisecond,
		"still quiet after the connection broke")
	time.Sleep(100 * time.Millisecond)
	assert.False(t, hub.Quiet("q", t2), "quiet again without a new confirmation")
	assert.False(t, hub.Quiet("q", time.Now()))
}
