package dlock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/scripts"
)

// errReleased is the cause of a hold context's cancellation after Unlock.
var errReleased = errors.New("dlock: released")

// watchdog is the one goroutine per Client that keeps leases alive and tells
// holders when a hold is lost. Every period (a third of the watchdog timeout)
// it renews every renewable lease in batches of up to renewBatch keys per
// script call, all calls of a period in one pipeline. Between periods it
// wakes at the earliest lease deadline, so a lease whose renewals keep
// failing, or a WithLease hold that runs out, is reported when its time is up
// rather than at the next period.
type watchdog struct {
	c      *Client
	period time.Duration

	mu       sync.Mutex
	leases   map[*lease]struct{} // held leases, renewable or not
	nextWake time.Time
	closed   bool         // no lease may be added: nothing would renew or report it
	lostQ    []lostReport // losses to report once mu is released

	kick chan struct{}
	stop chan struct{}
	done chan struct{}

	rounds atomic.Int64 // renewal rounds that sent anything
	calls  atomic.Int64 // renewal script calls sent
}

func newWatchdog(c *Client) *watchdog {
	w := &watchdog{
		c:      c,
		period: c.cfg.watchdog / 3,
		leases: make(map[*lease]struct{}),
		kick:   make(chan struct{}, 1),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	w.nextWake = time.Now().Add(w.period)
	go w.run()
	return w
}

// add starts tracking a hold. It wakes the loop only when the hold's deadline
// comes before the loop's next wake-up, so the common case costs no wake-up.
// It returns false after close: the caller must give the hold back.
func (w *watchdog) add(l *lease) bool {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return false
	}
	w.leases[l] = struct{}{}
	early := l.deadline.Before(w.nextWake)
	w.mu.Unlock()
	if !l.mark {
		w.c.tel.holdStarted(l)
	}
	if early {
		select {
		case w.kick <- struct{}{}:
		default:
		}
	}
	return true
}

// beginRelease marks l as being released, so that a renewal racing the unlock
// script does not report the hold lost. It returns false if l had been lost.
func (w *watchdog) beginRelease(l *lease) (held bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	l.releasing = true
	return l.state == leaseHeld
}

// abortRelease undoes beginRelease after an unlock that failed to run. After
// close, nothing renews l any more: it ends as Close ends every hold.
func (w *watchdog) abortRelease(l *lease) {
	w.mu.Lock()
	l.releasing = false
	if w.closed {
		w.closeLocked(l)
	}
	w.mu.Unlock()
}

// released ends l after a successful unlock. It returns the cause when l had
// been lost before, so Unlock can say so, and nil otherwise.
func (w *watchdog) released(l *lease) (lostCause error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	l.releasing = false
	switch l.state {
	case leaseLost:
		return l.cause
	case leaseHeld:
		w.endLocked(l, errReleased)
	}
	return nil
}

// endLocked ends a held lease normally.
func (w *watchdog) endLocked(l *lease, cause error) {
	delete(w.leases, l)
	l.ended(leaseReleased, cause)
	if !l.mark {
		w.c.tel.holdEnded(l, resultReleased)
	}
}

// lostCause returns why l was lost, or nil while it is held or after a
// normal release.
func (w *watchdog) lostCause(l *lease) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if l.state == leaseLost {
		return l.cause
	}
	return nil
}

// isHeld reports whether l is still held as far as this Client knows.
func (w *watchdog) isHeld(l *lease) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return l.state == leaseHeld
}

// deadline returns the time until which the server is known to keep l.
func (w *watchdog) deadline(l *lease) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return l.deadline
}

// dropped forgets l without reporting anything, when a newer lease replaces it.
func (w *watchdog) dropped(l *lease) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if l.state == leaseHeld {
		w.endLocked(l, errReleased)
	}
}

// lose reports l lost with the given cause, which wraps ErrLost. It is a
// no-op for a hold that already ended.
func (w *watchdog) lose(l *lease, cause error) {
	w.mu.Lock()
	w.loseLocked(l, cause)
	w.unlock()
}

// lostReport is a loss to record in telemetry and logs, or a waiting mark
// whose onLost hook must run.
type lostReport struct {
	l     *lease
	cause error
}

// loseLocked ends l as lost. Its holder learns at once, through the lost
// channel and the hold context; the span, metrics and log line follow when
// the caller releases mu with unlock, so that exporters and log handlers
// never run under the watchdog's lock.
func (w *watchdog) loseLocked(l *lease, cause error) {
	if l.state != leaseHeld {
		return
	}
	delete(w.leases, l)
	l.ended(leaseLost, cause)
	if !l.mark || l.onLost != nil {
		w.lostQ = append(w.lostQ, lostReport{l, cause})
	}
}

// closeLocked ends l because the Client closed: lost to its holder (the
// cause matches ErrLost and ErrClosed), but neither counted nor logged as a
// loss, since a shutdown is not one.
func (w *watchdog) closeLocked(l *lease) {
	if l.state != leaseHeld {
		return
	}
	cause := fmt.Errorf("%w: %w", ErrLost, ErrClosed)
	delete(w.leases, l)
	l.ended(leaseLost, cause)
	if !l.mark {
		w.c.tel.holdEnded(l, resultClosed)
	}
}

// unlock releases mu and reports the losses recorded meanwhile.
func (w *watchdog) unlock() {
	q := w.lostQ
	w.lostQ = nil
	w.mu.Unlock()
	for _, r := range q {
		if r.l.mark {
			r.l.onLost()
			continue
		}
		w.c.tel.holdEnded(r.l, resultLost)
		w.c.tel.holdLost(r.l, r.cause)
		w.c.cfg.logger.Warn("dlock: hold lost", "name", r.l.name, "key", r.l.key, "holder", holderOf(r.l.spec), "cause", r.cause.Error())
	}
}

// holderOf is the part of a lease's renewal spec that is safe to log: the
// owner ID of a reentrant hold. A plain mutex's token is not logged.
func holderOf(spec string) string {
	if strings.HasPrefix(spec, "h") {
		return spec[1:]
	}
	return ""
}

func (w *watchdog) run() {
	defer close(w.done)
	timer := time.NewTimer(w.period)
	defer timer.Stop()
	nextRenew := time.Now().Add(w.period)
	for {
		select {
		case <-w.stop:
			return
		case <-timer.C:
		case <-w.kick:
		}
		if !time.Now().Before(nextRenew) {
			w.renewAll()
			nextRenew = time.Now().Add(w.period)
		}
		timer.Reset(time.Until(w.expire(time.Now(), nextRenew)))
	}
}

// expire reports lost every hold whose deadline has passed and returns when
// the loop must wake next: at nextRenew or the earliest remaining deadline.
func (w *watchdog) expire(now, nextRenew time.Time) time.Time {
	w.mu.Lock()
	defer w.unlock()
	next := nextRenew
	for l := range w.leases {
		switch {
		case l.releasing:
		case !now.Before(l.deadline):
			if l.renew {
				w.loseLocked(l, fmt.Errorf("%w: not renewed within the %v lease", ErrLost, l.ttl))
			} else {
				w.loseLocked(l, fmt.Errorf("%w: the %v lease expired", ErrLost, l.ttl))
			}
		case l.deadline.Before(next):
			next = l.deadline
		}
	}
	w.nextWake = next
	return next
}

type renewBatchCall struct {
	leases []*lease
	keys   []string
	args   []any
}

// renewAll renews every renewable hold: one script call per renewBatch keys
// (per hash slot on a cluster), all sent in one pipeline.
func (w *watchdog) renewAll() {
	ttl := w.c.cfg.watchdog
	batches, earliest := w.batches(millis(ttl))
	if len(batches) == 0 {
		return
	}
	// Give up on the round in time to report a lease that runs out meanwhile.
	timeout := w.period
	if d := time.Until(earliest); d < timeout {
		timeout = max(d, 10*time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()

	sent := time.Now()
	cmds := w.send(ctx, batches)
	w.rounds.Add(1)
	w.calls.Add(int64(len(batches)))

	var failed error
	var renewed, gone, failedN int64
	w.mu.Lock()
	defer w.unlock()
	bg := context.Background()
	for i, b := range batches {
		w.c.tel.batchSize.Record(bg, int64(len(b.leases)))
		res, err := cmds[i].Int64Slice()
		if err != nil || len(res) != len(b.leases) {
			if err == nil {
				err = fmt.Errorf("renew: %d results for %d keys", len(res), len(b.leases))
			}
			failed = err
			failedN += int64(holdsIn(b.leases))
			continue
		}
		for j, l := range b.leases {
			if l.state != leaseHeld || l.releasing {
				continue
			}
			if res[j] == 1 {
				if !l.mark {
					renewed++
				}
				if d := sent.Add(ttl); d.After(l.deadline) {
					l.deadline = d
				}
			} else {
				if !l.mark {
					gone++
				}
				w.loseLocked(l, fmt.Errorf("%w: renewal found the hold gone", ErrLost))
			}
		}
	}
	for _, r := range []struct {
		n      int64
		result string
	}{{renewed, resultRenewed}, {gone, resultGone}, {failedN, resultFailed}} {
		if r.n > 0 {
			w.c.tel.renewals.Add(bg, r.n, cachedAttrs("", r.result))
		}
	}
	if failed != nil {
		w.c.cfg.logger.Warn("dlock: lease renewal failed", "error", failed.Error())
	}
}

// batches groups the renewable holds into script calls and returns the
// earliest deadline among them.
func (w *watchdog) batches(ttlMillis int64) ([]renewBatchCall, time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []renewBatchCall
	open := map[uint16]int{} // slot (or 0 off-cluster) -> index of its open batch
	var earliest time.Time
	for l := range w.leases {
		if !l.renew || l.releasing {
			continue
		}
		if earliest.IsZero() || l.deadline.Before(earliest) {
			earliest = l.deadline
		}
		var s uint16
		if w.c.cluster {
			s = slot(l.key)
		}
		i, ok := open[s]
		if !ok || len(out[i].keys)+1+len(l.extra) > renewBatch {
			out = append(out, renewBatchCall{args: []any{ttlMillis}})
			i = len(out) - 1
			open[s] = i
		}
		b := &out[i]
		b.leases = append(b.leases, l)
		b.keys = append(b.keys, l.key)
		b.keys = append(b.keys, l.extra...)
		b.args = append(b.args, l.spec)
	}
	return out, earliest
}

// send runs the batches, pipelined when there are several. When the server's
// script cache is empty (SCRIPT FLUSH, restart, failover), the script is
// loaded once and the pipeline sent again: 3 round trips, never per batch.
func (w *watchdog) send(ctx context.Context, batches []renewBatchCall) []*redis.Cmd {
	rdb := w.c.rdb
	cmds := make([]*redis.Cmd, len(batches))
	if len(batches) == 1 {
		cmds[0] = scripts.Renew.Run(ctx, rdb, batches[0].keys, batches[0].args...)
		return cmds
	}
	pipeline := func() {
		_, _ = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, b := range batches {
				cmds[i] = scripts.Renew.EvalSha(ctx, p, b.keys, b.args...)
			}
			return nil
		})
	}
	pipeline()
	for _, cmd := range cmds {
		if err := cmd.Err(); err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
			if scripts.Renew.Load(ctx, rdb).Err() == nil {
				pipeline()
			}
			break
		}
	}
	return cmds
}

// close stops the loop, waits for it, and reports every remaining hold lost
// with a cause matching both ErrLost and ErrClosed, since nothing renews it
// any more. Holds being released right now are left to their Unlock.
func (w *watchdog) close() {
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	for l := range w.leases {
		if !l.releasing {
			w.closeLocked(l)
		}
	}
}

// holdsIn counts the leases that are holds, not waiting marks.
func holdsIn(ls []*lease) int {
	n := 0
	for _, l := range ls {
		if !l.mark {
			n++
		}
	}
	return n
}
