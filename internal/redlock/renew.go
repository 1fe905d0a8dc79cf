package redlock

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/lease"
	"github.com/dlock-go/dlock/internal/scripts"
	"github.com/dlock-go/dlock/internal/telemetry"
	"github.com/dlock-go/dlock/internal/wire"
)

// The Redlock's renewals: its watchdog (internal/lease) keeps one lease per
// hold, whose deadline is the quorum's, and sends its renewal calls through
// sendRenewals, which runs each on every master at once.

// Per master, what a renewal found for one lease.
const (
	rlGone    int8 = 0  // the master does not have the key as the holder's
	rlRenewed int8 = 1  // renewed
	rlFailed  int8 = -1 // no answer: the request failed or timed out
)

// sendRenewals renews the leases of calls on every master in parallel, each
// with the node timeout. A lease is renewed when a quorum of masters renewed
// it, and its new deadline counts from when the renewals were sent (the
// watchdog's rule), which every master's new expiry follows. A lease is
// lost at once when so many masters no longer have it that the others
// cannot make a quorum. Otherwise (masters that did not answer could still
// make one) its renewal failed: the watchdog tries again at its next tick,
// and the lease ends at its deadline if no round reaches a quorum by then.
//
// Renewed leases are then re-acquired, with their own ID and token, on the
// masters that no longer had them (a master restarted or flushed), so that
// the hold keeps as many masters as it can. Lost leases are released on the
// masters that still had them.
func (r *Redlock) sendRenewals(ctx context.Context, calls []lease.RenewCall, settle func(lease.RenewResult)) {
	var leases []*lease.Lease
	for _, c := range calls {
		leases = append(leases, c.Leases...)
	}
	ttl := leases[0].TTL
	sent := time.Now()
	got, answered := fanOut(r, ctx, nodeTimeout(ttl), func(ctx context.Context, n *master) []int8 {
		return renewOn(ctx, n.rdb, calls, len(leases))
	})
	for i := range got {
		if !answered[i] {
			got[i] = slices.Repeat([]int8{rlFailed}, len(leases))
		}
	}
	var wg sync.WaitGroup

	// One script call per call and master, each of its call's size.
	out := lease.RenewResult{Sent: sent}
	for range r.nodes {
		for _, c := range calls {
			out.Scripts = append(out.Scripts, len(c.Leases))
		}
	}
	type fix struct {
		node int
		l    *lease.Lease
	}
	var reacquire, release []fix
	for k, l := range leases {
		ones, fails := 0, 0
		for i := range r.nodes {
			switch got[i][k] {
			case rlRenewed:
				ones++
			case rlFailed:
				fails++
			}
		}
		call := lease.RenewCall{Leases: []*lease.Lease{l}}
		var reply lease.RenewReply
		switch {
		case ones >= r.quorum:
			reply.Res = []int64{1}
			for i := range r.nodes {
				if got[i][k] == rlGone {
					reacquire = append(reacquire, fix{i, l})
				}
			}
		case ones+fails < r.quorum:
			reply.Res = []int64{0}
			for i := range r.nodes {
				if got[i][k] == rlRenewed {
					release = append(release, fix{i, l})
				}
			}
		default:
			reply.Err = fmt.Errorf("redlock: renewed on %d of %d masters, %d unreachable; a quorum is %d", ones, len(r.nodes), fails, r.quorum)
		}
		out.Calls = append(out.Calls, call)
		out.Replies = append(out.Replies, reply)
	}
	settle(out)

	for _, f := range reacquire {
		wg.Go(func() { r.reacquire(ctx, f.node, f.l) })
	}
	for _, f := range release {
		wg.Go(func() { r.releaseLease(ctx, f.node, f.l) })
	}
	wg.Wait()
}

// reacquireHook, when set (by tests), runs between the check that a hold
// is kept and its re-acquire.
var reacquireHook atomic.Pointer[func()]

// reacquire takes hold l's key again on a master that lost it. The hold may
// be released (or lost) while the request is on its way, and a release's
// 'u' may reach the master first: so once the master granted it, the hold
// is checked again, and the key given back if the hold is no longer kept.
// The release marks the hold before it sends its 'u', so either the release
// finds the key or this does.
func (r *Redlock) reacquire(ctx context.Context, node int, l *lease.Lease) {
	h := l.Hold()
	if h == nil || !r.Core.WD.Keeping(l) {
		return
	}
	if hook := reacquireHook.Load(); hook != nil {
		(*hook)()
	}
	nctx, cancel := context.WithTimeout(ctx, nodeTimeout(l.TTL))
	defer cancel()
	res, err := r.nodes[node].run(nctx, keysOf(l.Key), "r", h.Kind, l.Spec.ID, wire.Millis(l.TTL), strconv.FormatUint(h.Token, 10), fenceTTL(l.TTL)).Result()
	if err == nil {
		if t, derr := wire.DecodeTry(res); derr == nil && !t.Held {
			return // refused: the key is someone else's
		}
	}
	if !r.Core.WD.Keeping(l) {
		// Granted, or failed in transit (it may have been granted).
		r.releaseLease(ctx, node, l)
	}
}

// releaseLease frees lease l's key on one master, if l holds it there.
func (r *Redlock) releaseLease(ctx context.Context, node int, l *lease.Lease) {
	nctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), nodeTimeout(l.TTL))
	defer cancel()
	_ = r.nodes[node].run(nctx, keysOf(l.Key), "u", telemetry.KindMutex, l.Spec.ID, 0, "0", r.Core.ID).Err()
}

// renewOn runs the renewal calls on one master, in one pipeline (a second
// one, with the script's source, if the master's script cache is empty),
// and returns what it found for each lease, in order.
func renewOn(ctx context.Context, rdb redis.UniversalClient, calls []lease.RenewCall, leases int) []int8 {
	out := make([]int8, leases)
	cmds := make([]*redis.Cmd, len(calls))
	_, _ = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, c := range calls {
			cmds[i] = scripts.Renew.EvalSha(ctx, p, c.Keys, c.Args...)
		}
		return nil
	})
	if errs.IsNoScript(cmds[0].Err()) {
		_, _ = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, c := range calls {
				cmds[i] = scripts.Renew.Eval(ctx, p, c.Keys, c.Args...)
			}
			return nil
		})
	}
	k := 0
	for i, c := range calls {
		res, err := cmds[i].Int64Slice()
		if err == nil && len(res) != len(c.Leases) {
			err = fmt.Errorf("renew: %d results for %d keys", len(res), len(c.Leases))
		}
		for j := range c.Leases {
			switch {
			case err != nil:
				out[k] = rlFailed
			case res[j] == 1:
				out[k] = rlRenewed
			default:
				out[k] = rlGone
			}
			k++
		}
	}
	return out
}
