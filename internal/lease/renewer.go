package lease

import (
	"container/heap"
	"context"
	"fmt"
	"time"

	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/telemetry"
	"github.com/dlock-go/dlock/internal/wire"
)

// The watchdog's renewer: the schedule of renewals, the queue of renewal
// pipelines, and the goroutines that send them. See watchdog.go; how the
// pipelines reach Redis is renewals.go's.

// RenewCall is one call of internal/scripts/renew.lua: the leases it renews, with
// their keys and specs in order.
type RenewCall struct {
	Leases []*Lease
	Keys   []string
	Args   []any
}

// RenewReply is the reply to one renewal call: per lease, 1 when it was
// renewed and 0 when its hold is gone; or the error that failed the call.
type RenewReply struct {
	Res []int64
	Err error
}

// RenewResult is what one request of renewal calls came back with.
type RenewResult struct {
	Calls   []RenewCall
	Replies []RenewReply // one per call
	Sent    time.Time    // when the request went out, or earlier
	Scripts []int        // the leases of each script call it carried
	Notice  error        // something to log once, not a failure of these calls
}

// renewSender sends a chunk's renewal calls, without waiting for other
// chunks in flight, and hands every call's reply to settle as soon as it
// has it: all at once, or in parts (a cluster's nodes answer separately).
// It returns when every call has been settled.
type Sender func(ctx context.Context, calls []RenewCall, settle func(RenewResult))

const (
	// RenewBatch is the most keys one renewal script call carries.
	RenewBatch = 100
	// renewCallsPerRound caps the script calls one pipeline carries, so that
	// a round of many leases goes out as several pipelines in parallel.
	renewCallsPerRound = 50
	// renewKeysPerRound caps the keys of a chunk on a cluster, where calls
	// are per hash slot and the sender merges them per node (see
	// renew_cluster.go): a chunk there fills as many calls as elsewhere.
	renewKeysPerRound = renewCallsPerRound * RenewBatch
)

// renewSenders is how many renewal pipelines may be in flight at once (a
// variable for tests).
var renewSenders = 8

// schedule puts l in the bucket of due's tick, and wakes the renewer if that
// tick comes before the one it waits for. An entry of l in another bucket
// is stale from then on: the renewer drops it. Called with mu held.
func (w *Watchdog) schedule(l *Lease, due int64) {
	if l.TTL < w.basis {
		w.fitTick(l.TTL)
	}
	t := w.tickOf(due)
	if len(w.due) == 0 || t < w.earliestTick() {
		kick(w.renewKick)
	}
	l.next = t
	w.due[t] = append(w.due[t], l)
}

// sampleRTT records how long a renewal request took: the estimate jumps
// up to a longer round trip at once, and comes down slowly.
func (w *Watchdog) sampleRTT(d int64) {
	rtt := w.rtt.Load()
	if d > rtt {
		w.rtt.Store(d)
		return
	}
	w.rtt.Store(rtt + (d-rtt)/8)
}

// fitTick makes the schedule's resolution a twelfth of a third of ttl, a
// lease shorter than any scheduled before (a handle's WithRenewedLease below
// the Client's watchdog timeout), and moves every lease scheduled to its
// bucket at the new resolution. Once per shorter lease: the resolution only
// grows finer. Called with mu held.
func (w *Watchdog) fitTick(ttl time.Duration) {
	w.basis = ttl
	want := max(ttl/3/12, time.Millisecond)
	if want >= w.tick {
		return
	}
	old := int64(w.tick)
	w.tick = want
	due := make(map[int64][]*Lease, len(w.due))
	for t, ls := range w.due {
		for _, l := range ls {
			if l.next == t {
				l.next = w.tickOf(t * old)
				due[l.next] = append(due[l.next], l)
			}
		}
	}
	w.due = due
	kick(w.renewKick)
}

// period is how long after a renewal of l is sent the next one goes out:
// a third of its lease, shorter when renewals' round trips are long. A
// renewal's reply extends the lease from its send time, and must be in
// before the deadline the one before it set: that leaves the lease, less
// the drift margin, a period and a round trip, for any stall of the
// process, the network or the server. The period shrinks, down to a sixth
// of the lease, to keep that slack at least two periods: at round trips of
// 40% of the lease, a stall of 0.39 of it is survived instead of 0.26 (at a
// third) or 0.29 (at a slack of one period, which lost a hold in one of a
// few runs of the busy-machine test beside the rest of the suite).
func (w *Watchdog) period(l *Lease) int64 {
	third := int64(l.TTL / 3)
	rtt := w.rtt.Load()
	p := (int64(l.TTL-DriftMargin(l.TTL)) - rtt) / 3
	return max(min(p, third), int64(l.TTL/6))
}

// runRenewer queues each tick's renewals for the senders.
func (w *Watchdog) runRenewer() { w.loop(w.renewKick, w.dispatch) }

// dispatch queues renewals for the leases whose tick has come, and returns
// how long until it must look again (false: nothing to wait for).
//
// A lease is taken when it is due, together with the leases due within a
// quarter of their period: renewing them a little early costs nothing, and
// it draws a Client's leases into few rounds, whenever their holds were
// taken. The leases taken go into script calls of renewBatch keys and
// chunks of renewCallsPerRound calls (on a cluster, of calls per hash slot
// up to renewKeysPerRound keys, which the sender merges per node), which
// renewSenders goroutines send, earliest deadline first. A sender never
// waits for another's reply: a new hold's first renewal has little slack,
// its grant's round trip already spent. Each pipeline goes on a renewal
// connection of the Client's (see renewals.go), which is always warm, or on
// the pool when all of those are in flight.
func (w *Watchdog) dispatch() (time.Duration, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := w.mono(time.Now())
	horizon := w.tickOf(now + int64(w.horizon))
	var round, behind []*Lease
	for t, ls := range w.due {
		if t > horizon {
			continue
		}
		kept := ls[:0]
		for _, l := range ls {
			switch {
			case l.state != leaseHeld || !l.renew || l.next != t:
			case t > w.tickOf(now+int64(l.TTL/12)):
				kept = append(kept, l) // not due within a quarter of its period yet
			case l.queued:
				// Its last renewal has not gone out yet: the senders are
				// behind. That one will do; another would only add to the
				// work they are behind on.
				behind = append(behind, l)
			default:
				// A hold being released is renewed too: its release may take
				// long (a slow network) or fail, and the renewal script renews
				// nothing that is no longer ours.
				l.renewing++
				l.queued = true
				round = append(round, l)
			}
		}
		if len(kept) == 0 {
			delete(w.due, t)
		} else {
			w.due[t] = kept
		}
	}
	// Fixed rate: the next renewal of each is due a period after this one,
	// whenever this one's reply comes, so that a slow reply delays no other
	// renewal (see period).
	for _, l := range round {
		w.schedule(l, now+w.period(l))
	}
	for _, l := range behind {
		w.schedule(l, now+w.period(l))
	}
	calls := w.batches(round)
	for len(calls) > 0 {
		n, keys := 0, 0
		for n < len(calls) {
			keys += len(calls[n].Keys)
			if n > 0 && (!w.cluster && n == renewCallsPerRound || w.cluster && keys > renewKeysPerRound) {
				break
			}
			n++
		}
		c := &chunk{calls: calls[:n], deadline: -1}
		calls = calls[n:]
		for _, b := range c.calls {
			for _, l := range b.Leases {
				if c.deadline < 0 || l.deadline < c.deadline {
					c.deadline = l.deadline
				}
			}
		}
		heap.Push(&w.chunks, c)
		w.work.Signal()
	}
	if len(w.due) == 0 {
		return 0, false
	}
	// Look again when the earliest lease left is due; leases held back by a
	// release in flight are looked at again next tick.
	wait := time.Duration(w.earliestTick()*int64(w.tick) - now)
	if wait <= 0 {
		wait = w.tick
	}
	return wait, true
}

func (w *Watchdog) earliestTick() int64 {
	first := true
	var min int64
	for t := range w.due {
		if first || t < min {
			min, first = t, false
		}
	}
	return min
}

// chunk is one pipeline of renewal calls, queued until a sender takes it.
type chunk struct {
	calls    []RenewCall
	deadline int64 // the earliest deadline of its leases when it was queued
}

// chunkHeap orders chunks by deadline, earliest first.
type chunkHeap []*chunk

func (h chunkHeap) Len() int           { return len(h) }
func (h chunkHeap) Less(i, j int) bool { return h[i].deadline < h[j].deadline }
func (h chunkHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *chunkHeap) Push(x any)        { *h = append(*h, x.(*chunk)) }
func (h *chunkHeap) Pop() any {
	old := *h
	c := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return c
}

// runSender sends queued chunks, earliest deadline first, until close.
func (w *Watchdog) runSender() {
	defer w.senders.Done()
	for {
		w.mu.Lock()
		for w.chunks.Len() == 0 && !w.stopping {
			w.work.Wait()
		}
		if w.stopping {
			w.mu.Unlock()
			return
		}
		c := heap.Pop(&w.chunks).(*chunk)
		for _, b := range c.calls {
			for _, l := range b.Leases {
				l.queued = false
			}
		}
		w.mu.Unlock()
		w.renewPipeline(c)
	}
}

// renewPipeline sends one chunk of renewal calls and records the replies.
// The request may take as long as its leases have left; past that, the
// clock has ended them anyway.
func (w *Watchdog) renewPipeline(c *chunk) {
	now := w.mono(time.Now())
	if late := time.Duration(now - c.deadline); late > 0 {
		w.log.Warn("dlock: renewals are falling behind: a renewal went out after its lease's deadline",
			"late", late.String(), "leases", leasesIn(c.calls))
	}
	ctx, cancel := context.WithDeadline(w.stopCtx, w.wall(max(c.deadline, now+int64(10*time.Millisecond))))
	defer cancel()
	w.send(ctx, c.calls, w.settleRenewals)
}

func leasesIn(calls []RenewCall) int {
	n := 0
	for _, b := range calls {
		n += len(b.Leases)
	}
	return n
}

// settleRenewals records the replies of renewal calls sent at r.Sent: a
// renewed lease's deadline moves forward to what this renewal gives it, if
// that is later (replies of a lease's renewals may come back in any
// order); a lease the server no longer has is lost; a lease whose call
// failed is tried again at the next tick. Its next renewal was scheduled
// when this one went out (see dispatch). At most a lease's lease divided
// by its period (six) of its renewals are in flight at once: the requests
// end at the lease's deadline.
func (w *Watchdog) settleRenewals(r RenewResult) {
	var failed error
	var renewed, gone, failedN int64
	w.sentCalls.Add(int64(len(r.Scripts)))
	for _, n := range r.Scripts {
		w.tel.Batch(n)
	}
	if r.Notice != nil {
		w.log.Warn("dlock: " + r.Notice.Error())
	}
	sent := w.mono(r.Sent)
	w.mu.Lock()
	now := w.mono(time.Now())
	if len(r.Replies) > 0 && r.Replies[0].Err == nil {
		w.sampleRTT(now - sent)
	}
	for i, b := range r.Calls {
		res, err := r.Replies[i].Res, r.Replies[i].Err
		if err == nil && len(res) != len(b.Leases) {
			err = fmt.Errorf("renew: %d results for %d keys", len(res), len(b.Leases))
		}
		for j, l := range b.Leases {
			_, isHold := l.of.(*Hold)
			l.renewing--
			switch {
			case l.state != leaseHeld:
			case err != nil:
				failed = err
				if isHold {
					failedN++
				}
				w.schedule(l, now+1) // the next tick
			case res[j] == 1:
				if isHold {
					renewed++
				}
				l.GrantTTL = 0
				if d := sent + int64(l.TTL-DriftMargin(l.TTL)); d > l.deadline {
					l.sent, l.deadline = sent, d
					if l.idx >= 0 {
						heap.Fix(&w.deadlines, l.idx)
					}
				}
			case l.releasing:
				// Gone: most likely its release, in flight, took it. The
				// release says which.
			default:
				if isHold {
					gone++
				}
				w.endLocked(l, leaseLost, fmt.Errorf("%w: renewal found the hold gone", errs.ErrLost))
			}
		}
	}
	if w.settled != nil {
		close(w.settled)
		w.settled = nil
	}
	w.unlockAsync()
	for _, r := range []struct {
		n      int64
		result string
	}{{renewed, telemetry.ResultRenewed}, {gone, telemetry.ResultGone}, {failedN, telemetry.ResultFailed}} {
		if r.n > 0 {
			w.tel.Renewals(r.n, r.result)
		}
	}
	switch {
	case failed == nil:
		if renewed+gone > 0 {
			w.outage.Saw(nil)
		}
	case errs.IsUnavailable(failed):
		w.outage.Saw(failed)
	default:
		w.log.Warn("dlock: lease renewal failed", "error", failed.Error())
	}
}

// batches groups leases into script calls of up to renewBatch keys, one
// lease term per call (holds and marks have different ones), and one hash
// slot per call on a cluster (where the sender merges the calls of a chunk
// per node when the servers allow it: see renew_cluster.go).
func (w *Watchdog) batches(round []*Lease) []RenewCall {
	type group struct {
		slot uint16
		ttl  time.Duration
	}
	var out []RenewCall
	open := map[group]int{} // -> index of its open batch
	for _, l := range round {
		g := group{ttl: l.TTL}
		if w.cluster {
			g.slot = wire.Slot(l.Key)
		}
		i, ok := open[g]
		if !ok || len(out[i].Keys)+l.Spec.Keys() > RenewBatch {
			out = append(out, RenewCall{Args: []any{wire.Millis(l.TTL)}})
			i = len(out) - 1
			open[g] = i
		}
		b := &out[i]
		b.Leases = append(b.Leases, l)
		b.Keys = append(b.Keys, l.Key)
		b.Keys = append(b.Keys, l.Extra...)
		b.Args = append(b.Args, l.Arg)
	}
	return out
}
