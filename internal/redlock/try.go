package redlock

// A Redlock Mutex's tries: one try asks every master at once (try),
// decides on a quorum, writes the token back, and gives back what it does
// not keep; acquire and attempt run Lock and TryLock on it.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/dlock-go/dlock/internal/engine"
	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/lease"
	"github.com/dlock-go/dlock/internal/telemetry"
	"github.com/dlock-go/dlock/internal/wire"
)

// reply is one master's answer to a try.
type reply struct {
	node    int
	granted bool
	token   uint64
	holder  string
	left    time.Duration
	err     error
}

// try is one try on every master: it collects the replies, and once the
// outcome is decided, gives back what late replies grant if the try failed.
type try struct {
	rm     *Mutex
	id     string
	ttl    time.Duration
	sent   time.Time
	nodeTO time.Duration

	mu      sync.Mutex
	decided bool
	keep    bool        // decided: the try holds, until abandoned
	held    *lease.Hold // kept: the hold it made
	replies []reply     // in arrival order
	arrived chan struct{}
}

// run sends the try to every master, with requests on ctx. It returns the
// replies that decide it: when a quorum granted, or when so many refused or
// failed that no quorum can, or when done is closed (the caller's context
// ended: the replies so far, the others counted as failed).
//
// With a gate (a master's index, else -1), it asks that master first, alone,
// and the others only once it granted the try, or failed, or did not answer
// within the node timeout. A refusal there ends the try: the gate's reply
// alone is returned. Contending waiters woken by one release all go for the
// gate first, so one of them wins it and the others are refused at the cost
// of one request each, where asking every master at once splits the votes
// among them and makes all of them back off. This is still the Redlock
// algorithm, which asks the masters in turn; the validity counts from the
// gate's request.
func (t *try) run(ctx context.Context, done <-chan struct{}, proposal uint64, gate int) []reply {
	r := t.rm.r
	n := len(r.nodes)
	t.arrived = make(chan struct{}, n)
	t.sent = time.Now()
	args := []any{"t", t.rm.h.Kind, t.id, wire.Millis(t.ttl), strconv.FormatUint(proposal, 10), fenceTTL(t.ttl)} // the same for every master
	send := func(node *master) {
		r.goCall(func() {
			cctx, cancel := context.WithTimeout(ctx, t.nodeTO)
			res, err := node.run(cctx, t.rm.keys, args...).Slice()
			cancel()
			rep := decodeRedlockTry(node.index, res, err)
			node.failing.Store(err != nil && !errs.IsReply(err))
			t.mu.Lock()
			t.replies = append(t.replies, rep)
			decided, keep, held := t.decided, t.keep, t.held
			if t.decided && len(t.replies) == len(r.nodes) {
				t.rm.live.Delete(t.id)
			}
			t.mu.Unlock()
			// A late grant joins a kept try's hold only while the hold is
			// kept: one that ended (lost, closed) or is being released
			// has no use for it. Unlock and ForceUnlock abandon the try
			// before their scripts go out, so either they find the key or
			// this gives it back.
			late := decided && (!keep || held != nil && !r.Core.WD.Keeping(&held.Lease))
			if late && (rep.granted || rep.err != nil) {
				t.rm.release(node, t.id)
			}
			t.arrived <- struct{}{}
		})
	}
	if gate >= 0 {
		send(r.nodes[gate])
		timer := time.NewTimer(t.nodeTO)
		select {
		case <-t.arrived:
			t.arrived <- struct{}{} // counted again below
			t.mu.Lock()
			rep := t.replies[0]
			t.mu.Unlock()
			if !rep.granted && rep.err == nil {
				timer.Stop()
				return []reply{rep}
			}
		case <-timer.C:
		case <-done:
			timer.Stop()
			return nil // the caller gives the try back
		}
		timer.Stop()
	}
	for _, node := range r.nodes {
		if node.index != gate {
			send(node)
		}
	}
	timer := time.NewTimer(overrun(t.nodeTO))
	defer timer.Stop()
	for {
		var now bool
		select {
		case <-t.arrived:
		case <-timer.C:
			now = true
		case <-done:
			now = true
		}
		if now {
			// Masters that have not answered count as failed; their
			// replies, when they come, are handled as late ones.
			t.mu.Lock()
			out := slices.Clone(t.replies)
			t.mu.Unlock()
			for _, node := range r.nodes {
				if !slices.ContainsFunc(out, func(rep reply) bool { return rep.node == node.index }) {
					out = append(out, reply{node: node.index, err: errNodeTimeout})
				}
			}
			return out
		}
		t.mu.Lock()
		granted, other := 0, 0
		for _, rep := range t.replies {
			if rep.granted {
				granted++
			} else {
				other++
			}
		}
		if granted >= r.quorum || other > n-r.quorum || len(t.replies) == n {
			out := slices.Clone(t.replies)
			t.mu.Unlock()
			return out
		}
		t.mu.Unlock()
	}
}

// giveBack decides the try given back, and waits for the give-backs unless
// ctx ends first (they go on in the background, and Close waits for them).
func (t *try) giveBack(ctx context.Context) {
	select {
	case <-t.decide(false, nil):
	case <-ctx.Done():
	}
}

// decide settles the try: kept, later grants join the hold (renewals and
// release cover every master); given back, every grant, and every reply
// that failed in transit (it may have been granted), is released. The
// channel it returns is closed when the give-backs are done.
func (t *try) decide(keep bool, held *lease.Hold) <-chan struct{} {
	t.mu.Lock()
	t.decided, t.keep, t.held = true, keep, held
	reps := slices.Clone(t.replies)
	if keep && len(reps) < len(t.rm.r.nodes) {
		t.rm.live.Store(t.id, t)
	}
	t.mu.Unlock()
	r := t.rm.r
	// A kept hold that an Unlock (or a loss) ended before this decision:
	// the Unlock found no live try to abandon, and a master whose release
	// overtook its try's request has granted it since. The replies in so
	// far are given back as for a try not kept; later ones are late (run).
	if keep && held != nil && !r.Core.WD.Keeping(&held.Lease) {
		keep = false
	}
	done := make(chan struct{})
	if keep {
		close(done)
		return done
	}
	var wg sync.WaitGroup
	for _, rep := range reps {
		if rep.granted || rep.err != nil {
			wg.Add(1)
			r.goCall(func() {
				defer wg.Done()
				t.rm.release(r.nodes[rep.node], t.id)
			})
		}
	}
	r.goCall(func() {
		wg.Wait()
		close(done)
	})
	return done
}

func decodeRedlockTry(node int, res []any, err error) reply {
	rep := reply{node: node, err: err}
	if err != nil {
		return rep
	}
	r, err := wire.DecodeTry(res)
	switch {
	case err != nil:
		rep.err = err
	case r.Held:
		rep.granted, rep.token = true, r.Token
	default:
		rep.holder, rep.left = r.Holder, r.Left
	}
	return rep
}

// errNoQuorum is why a Redlock try failed with too many masters unreachable.
var errNoQuorum = errors.New("dlock: redlock: no quorum of masters answered")

// attempt makes one try. It reports whether the caller holds the lock; when
// not, how long the lease of the holder that refused has left at most, and
// whether the votes were split (some granted, or the gate has yet to apply a
// release this Redlock has seen): then the caller should wait a random
// moment before trying again.
//
// gated asks for the try to go to the lock's gate master first (see run):
// the tries of a blocking Lock on a handle that met other callers within
// contendedFor do so, as they contend with them; other tries, and TryLock,
// do not, to hold in one round trip when nobody contends. A gate that
// failed the last request sent to it is skipped.
func (rm *Mutex) attempt(ctx context.Context, op string, gated bool) (ok bool, left time.Duration, split bool, err error) {
	r, h := rm.r, rm.h
	ttl, renew := h.Terms()
	t := &try{rm: rm, id: r.Core.NewToken(), ttl: ttl, nodeTO: nodeTimeout(ttl)}
	// The requests do not end with ctx, so that what they did is known and
	// can be given back; the caller waits for them only while ctx lasts.
	nc := engine.Detach(ctx)
	gate := -1
	if gated && rm.gate >= 0 && !r.nodes[rm.gate].failing.Load() {
		gate = rm.gate
	}
	reps := t.run(nc, ctx.Done(), r.proposal(), gate)
	if ctx.Err() != nil {
		t.giveBack(ctx)
		return false, 0, false, errs.NotObtained(op, h.Name, ctx)
	}

	var granted []reply
	var failed error
	for _, rep := range reps {
		switch {
		case rep.granted:
			granted = append(granted, rep)
		case rep.err != nil:
			failed = rep.err
		default:
			left = max(left, rep.left)
			telemetry.Blocked(ctx, rep.holder, rep.left)
		}
	}
	if len(granted) < r.quorum {
		rm.noteRefusal(reps)
		t.giveBack(ctx)
		for _, rep := range reps {
			if rep.err != nil && errs.IsReply(rep.err) {
				return false, 0, false, h.Fail(op, rep.err) // a key of another kind, say
			}
		}
		if errs := countErr(reps); errs > 0 && len(granted)+errs >= r.quorum {
			// The masters that failed could have made the quorum: the try
			// failed for want of masters, not because the lock is held.
			return false, left, len(granted) > 0, h.Fail(op, fmt.Errorf("%w: %w", errNoQuorum, failed))
		}
		// A master (the gate, or any two that decided the try before the
		// first one's grant came in) that refused for a holder whose release
		// this Redlock has seen lags behind the master that published it,
		// and that release wakes nobody again (it is applied once): look
		// again soon, as after a split vote, rather than at the end of the
		// old holder's lease.
		lagging := slices.ContainsFunc(reps, func(rep reply) bool {
			return !rep.granted && rep.err == nil && r.released(rep.holder)
		})
		return false, left, len(granted) > 0 || lagging, nil
	}

	// The token: the maximum over the grants, written back to those that
	// issued less, until a quorum has it.
	var token uint64
	for _, rep := range granted {
		token = max(token, rep.token)
	}
	have := 0
	var lower []int
	for _, rep := range granted {
		if rep.token == token {
			have++
		} else {
			lower = append(lower, rep.node)
		}
	}
	if have < r.quorum {
		wrote := make(chan bool, len(lower))
		for _, i := range lower {
			r.goCall(func() {
				wctx, cancel := context.WithTimeout(nc, t.nodeTO)
				defer cancel()
				n, err := r.nodes[i].run(wctx, rm.keys, "w", h.Kind, t.id, 0, strconv.FormatUint(token, 10), fenceTTL(t.ttl)).Int64()
				wrote <- err == nil && n == 1
			})
		}
	collect:
		for range lower {
			select {
			case ok := <-wrote:
				if ok {
					have++
				}
			case <-ctx.Done():
				break collect
			}
		}
	}
	r.sawToken(token)
	if have < r.quorum {
		t.giveBack(ctx)
		return false, 0, true, nil
	}
	if ctx.Err() != nil {
		t.giveBack(ctx)
		return false, 0, false, errs.NotObtained(op, h.Name, ctx)
	}
	// Validity: lease − elapsed − drift, on the monotonic clock.
	if left := time.Until(lease.Deadline(t.sent, ttl)); left < lease.MinValidity(ttl) {
		t.giveBack(ctx)
		h.C.Cfg.Logger.Warn("dlock: redlock grant came too late; given back",
			"name", h.Name, "lease_left", left.String(), "lease", ttl.String())
		return false, 0, true, nil
	}
	l := lease.NewHold(ctx, h.Name, h.Kind, h.Key, wire.Spec{Kind: wire.SpecHolder, ID: t.id}, ttl, renew, t.sent)
	l.Token = token
	rm.slot.Put(l, h.C.WD)
	if !h.C.WD.Add(&l.Lease) {
		rm.slot.TakeIf(l)
		t.giveBack(ctx)
		return false, 0, false, errs.ClosedOp(op, h.Name)
	}
	t.decide(true, l)
	rm.refuser.Store(nil)
	telemetry.Annotate(ctx, telemetry.AttrHoldCount.Int(1), telemetry.AttrToken.Int64(int64(token)))
	return true, 0, false, nil
}

// noteRefusal records who refused a try, and whether that shows other
// callers contending (see Mutex.contested): a refusal by a holder other
// than the one that refused the handle's previous try. A split vote against
// the same holder shows nothing: that holder's grant or release reached the
// masters at different times. Nor does a holder whose release this Redlock
// has seen: its release has yet to reach the master that refused.
func (rm *Mutex) noteRefusal(reps []reply) {
	holder := ""
	for _, rep := range reps {
		if !rep.granted && rep.err == nil && rep.holder != "" {
			holder = rep.holder
			break
		}
	}
	if holder == "" || rm.r.released(holder) {
		return
	}
	prev := rm.refuser.Swap(&holder)
	if prev != nil && *prev != holder {
		rm.contested.Store(int64(time.Since(epoch)))
	}
}

func countErr(reps []reply) int {
	n := 0
	for _, rep := range reps {
		if rep.err != nil {
			n++
		}
	}
	return n
}

// acquire runs Lock (block) or TryLock. A Lock that finds callers of this
// Redlock already waiting for the name waits behind them, its first try a
// moment later, rather than racing the one a release just woke: without it,
// a goroutine that unlocks and locks again at once wins every time, as its
// try leaves before the woken waiter's.
func (rm *Mutex) acquire(ctx context.Context, op string, block bool) (bool, error) {
	if block && rm.r.Core.Waits.Has(rm.keys[2]) {
		return rm.wait(ctx, op, 0, true)
	}
	ok, left, split, err := rm.attempt(ctx, op, block && rm.contended())
	if block && errors.Is(err, errNoQuorum) {
		err, split = nil, true // look again soon
	}
	if err != nil || ok || !block {
		return ok, err
	}
	return rm.wait(ctx, op, left, split)
}
