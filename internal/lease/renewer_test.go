package lease

import (
	"container/heap"
	"context"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/dlock-go/dlock/internal/telemetry"
	"github.com/dlock-go/dlock/internal/wire"
)

// While the senders are behind, a lease waits in the queue of renewals at
// most once: a renewal that comes due while the last one has not gone out
// yet is not queued again. (With 300,000 holds on a 3 s lease, a single
// Redis could not take the renewals of the holds already taken while the
// rest were acquired; the copies grew the queue past the number of holds,
// and 70% of them were lost.) The renewal that waited goes out once a
// sender is free, and the schedule goes on at its rate.
func TestRenewer_SendersBehind_LeaseQueuedOnce(t *testing.T) {
	defer func(n int) { renewSenders = n }(renewSenders)
	renewSenders = 1
	stalled := make(chan struct{})
	var mu sync.Mutex
	sent := map[string]int{} // renewals sent, by key
	send := func(_ context.Context, calls []RenewCall, settle func(RenewResult)) {
		at := time.Now()
		<-stalled
		r := RenewResult{Calls: calls, Sent: at}
		mu.Lock()
		for _, c := range calls {
			for _, l := range c.Leases {
				sent[l.Key]++
			}
			r.Replies = append(r.Replies, RenewReply{Res: slices.Repeat([]int64{1}, len(c.Leases))})
			r.Scripts = append(r.Scripts, len(c.Leases))
		}
		mu.Unlock()
		settle(r)
	}
	const ttl = 300 * time.Millisecond // renewed every 100 ms
	tel := telemetry.New(tracenoop.NewTracerProvider(), metricnoop.NewMeterProvider(), false)
	w := NewWatchdog(ttl, send, false, tel, &Outage{Log: slog.New(slog.DiscardHandler)})
	unstall := sync.OnceFunc(func() { close(stalled) })
	defer w.Close()
	defer unstall()

	var holds []*Hold
	for i := range 10 {
		h := NewHold(context.Background(), "n"+strconv.Itoa(i), "mutex", "k"+strconv.Itoa(i), wire.Spec{Kind: wire.SpecHolder, ID: "id"}, ttl, true, time.Now())
		require.True(t, w.Add(&h.Lease))
		holds = append(holds, h)
	}
	// The clock is not what this test is about: no hold expires while the
	// sender is stalled.
	w.mu.Lock()
	for _, h := range holds {
		h.deadline += int64(time.Minute)
		heap.Fix(&w.deadlines, h.idx)
	}
	w.mu.Unlock()

	queued := func() map[*Lease]int {
		w.mu.Lock()
		defer w.mu.Unlock()
		out := map[*Lease]int{}
		for _, c := range w.chunks {
			for _, b := range c.calls {
				for _, l := range b.Leases {
					out[l]++
				}
			}
		}
		return out
	}
	// One round went to the stalled sender; the next waits in the queue;
	// the three after it come due meanwhile.
	time.Sleep(6 * ttl / 3)
	q := queued()
	require.Len(t, q, len(holds), "every hold waits in the queue")
	for l, n := range q {
		assert.Equal(t, 1, n, "%s queued %d times", l.Key, n)
	}

	unstall()
	start := time.Now()
	time.Sleep(ttl)
	elapsed := time.Since(start)
	mu.Lock()
	defer mu.Unlock()
	for _, h := range holds {
		// The stalled round, the queued one, and one a period for the
		// ttl since, give or take the one in flight: a period of a third
		// of the lease, or as little as a sixth after the stall's long
		// round trip (see period).
		n := sent[h.Key]
		assert.GreaterOrEqual(t, n, 2+int(elapsed/(ttl/3))-1, "%s renewed %d times in %v", h.Key, n, elapsed)
		assert.LessOrEqual(t, n, 2+int(elapsed/(ttl/6))+1, "%s renewed %d times in %v", h.Key, n, elapsed)
		assert.True(t, w.Keeping(&h.Lease), "%s kept", h.Key)
	}
}
