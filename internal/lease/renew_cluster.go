package lease

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/scripts"
)

// Renewals on Redis Cluster, per node.
//
// The watchdog batches renewals per hash slot on a cluster, since a
// command's keys must share one. With leases spread over thousands of
// slots, that is about one script call per lease. So the sender merges a
// chunk's calls per master node instead, into calls of up to renewBatch
// keys of internal/scripts/renew_node.lua: renew.lua with the Redis 7 script flag
// allow-cross-slot-keys, its keys passed in ARGV (Redis checks that declared
// keys share a slot even with the flag). Each node's calls go in one
// pipeline on that node's client, in parallel with the other nodes', and
// each node's replies are settled as they come, so a slow node holds up no
// other node's leases.
//
// Whatever a node cannot renew, the sender renews at once, in the same
// round, per slot through the cluster client, which follows MOVED and ASK:
//   - the leases the script answers -1 for: a key whose slot the node no
//     longer serves (moved, migrating, importing), or of another type; each
//     in a call of its own, since the keys of a slot being migrated may be
//     split between two nodes (see splitUnsure);
//   - every lease of a call that failed: the node is down, or is a replica
//     now, or is loading, or out of memory, or the cluster is down.
//
// The per-slot requests keep the node request's send time, which is
// earlier: a lease's deadline is never later than its real renewal allows.
//
// A server before Redis 7.0 rejects the script's first line (a shebang);
// so do servers that know no such flag. The first such rejection turns the
// node script off for good: from then on, the sender sends the calls per
// slot as they are (renew.lua, one call per slot), still in one pipeline
// per node, in parallel, on the node's client; the calls a node fails
// (MOVED, ASK, down) go again through the cluster client, which follows
// the redirects. So even then a dead or hung node holds up no other node's
// leases, as it did when a chunk went out as one cluster pipeline: go-redis
// returns that only when every node has answered or failed, after its
// retries, by which time the other nodes' leases could have run out on the
// client's clock.

// sendPerNode sends calls (each within one slot) per master node: merged
// into node calls, or per slot once the servers have rejected the node
// script.
func (r *Renewals) sendPerNode(ctx context.Context, cc *redis.ClusterClient, calls []RenewCall, settle func(RenewResult)) {
	byNode := map[*redis.Client][]RenewCall{}
	var order []*redis.Client
	var unrouted []RenewCall
	for _, b := range calls {
		node, err := cc.MasterForKey(ctx, b.Keys[0])
		if err != nil {
			unrouted = append(unrouted, b)
			continue
		}
		if _, ok := byNode[node]; !ok {
			order = append(order, node)
		}
		byNode[node] = append(byNode[node], b)
	}
	var wg sync.WaitGroup
	for _, node := range order {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.sendToNode(ctx, node, byNode[node], settle)
		}()
	}
	if len(unrouted) > 0 {
		settle(r.pipeline(ctx, unrouted))
	}
	wg.Wait()
}

// nodeCall is one call of renew_node.lua: calls with one lease term, up to
// renewBatch keys in all.
type nodeCall struct {
	calls        []RenewCall
	leases, keys int
}

// mergeForNode merges calls bound for one node into node calls.
func mergeForNode(calls []RenewCall) []nodeCall {
	var out []nodeCall
	open := map[time.Duration]int{} // lease term -> index of its open node call
	for _, b := range calls {
		term := b.Leases[0].TTL
		i, ok := open[term]
		if !ok || out[i].keys+len(b.Keys) > RenewBatch {
			out = append(out, nodeCall{})
			i = len(out) - 1
			open[term] = i
		}
		n := &out[i]
		n.calls = append(n.calls, b)
		n.leases += len(b.Leases)
		n.keys += len(b.Keys)
	}
	return out
}

// args returns the node call's ARGV: the lease, the number of leases, their
// specs, and their keys.
func (n *nodeCall) args() []any {
	args := make([]any, 0, 2+n.leases+n.keys)
	args = append(args, n.calls[0].Args[0], n.leases)
	for _, b := range n.calls {
		args = append(args, b.Args[1:]...)
	}
	for _, b := range n.calls {
		for _, k := range b.Keys {
			args = append(args, k)
		}
	}
	return args
}

// sendToNode sends calls merged in one pipeline to node (per slot once the
// servers have rejected the node script), settles what the node renewed or
// found gone, and sends the rest again per slot through the cluster client.
func (r *Renewals) sendToNode(ctx context.Context, node *redis.Client, calls []RenewCall, settle func(RenewResult)) {
	if r.perSlot.Load() {
		r.sendSlotsToNode(ctx, node, calls, settle)
		return
	}
	merged := mergeForNode(calls)
	args := make([][]any, len(merged))
	for i := range merged {
		args[i] = merged[i].args()
	}
	cmds, sent := r.runOnNode(ctx, node, r.renewNodeScript(), nil, args)

	done := RenewResult{Sent: sent, Scripts: make([]int, len(merged))}
	var retry []RenewCall
	for i, n := range merged {
		done.Scripts[i] = n.leases
		res, err := cmds[i].Int64Slice()
		if err == nil && len(res) != n.leases {
			err = fmt.Errorf("renew_node: %d results for %d leases", len(res), n.leases)
		}
		if err != nil {
			if RejectsScriptFlags(err) && r.perSlot.CompareAndSwap(false, true) {
				done.Notice = fmt.Errorf("the cluster rejects the script flag allow-cross-slot-keys (%w): "+
					"renewals go per hash slot from now on, as before Redis 7.0", err)
			}
			retry = append(retry, n.calls...)
			continue
		}
		for _, b := range n.calls {
			part := res[:len(b.Leases)]
			res = res[len(b.Leases):]
			if !slices.Contains(part, -1) {
				done.Calls = append(done.Calls, b)
				done.Replies = append(done.Replies, RenewReply{Res: part})
				continue
			}
			kept, unsure := splitUnsure(b, part)
			if len(kept.Leases) > 0 {
				done.Calls = append(done.Calls, kept.RenewCall)
				done.Replies = append(done.Replies, RenewReply{Res: kept.res})
			}
			retry = append(retry, unsure...)
		}
	}
	settle(done)
	if len(retry) > 0 {
		// Sent later, but settled as of the node request: a lease's
		// deadline may come early, never late.
		again := r.pipeline(ctx, retry)
		again.Sent = sent
		settle(again)
	}
}

// sendSlotsToNode sends calls per slot (renew.lua, keys in KEYS) in one
// pipeline to node, settles the replies, and sends the calls that failed
// again through the cluster client, which follows MOVED and ASK. Those are
// settled as of the node request's send time.
func (r *Renewals) sendSlotsToNode(ctx context.Context, node *redis.Client, calls []RenewCall, settle func(RenewResult)) {
	keys := make([][]string, len(calls))
	args := make([][]any, len(calls))
	for i, b := range calls {
		keys[i], args[i] = b.Keys, b.Args
	}
	cmds, sent := r.runOnNode(ctx, node, scripts.Renew, keys, args)
	done := RenewResult{Sent: sent, Scripts: make([]int, len(calls))}
	var retry []RenewCall
	for i, b := range calls {
		done.Scripts[i] = len(b.Leases)
		res, err := cmds[i].Int64Slice()
		if err != nil {
			retry = append(retry, b)
			continue
		}
		done.Calls = append(done.Calls, b)
		done.Replies = append(done.Replies, RenewReply{Res: res})
	}
	settle(done)
	if len(retry) > 0 {
		again := r.pipeline(ctx, retry)
		again.Sent = sent
		settle(again)
	}
}

// runOnNode runs script once per element of args (with keys[i] in KEYS, or
// none when keys is nil) in one pipeline on node. Until node is known to
// have the script cached, the first call carries its source; calls that
// meet an empty script cache go again with it, in a second pipeline. It
// returns the replies and the first pipeline's send time.
func (r *Renewals) runOnNode(ctx context.Context, node *redis.Client, script *redis.Script, keys [][]string, args [][]any) ([]*redis.Cmd, time.Time) {
	keysOf := func(i int) []string {
		if keys == nil {
			return nil
		}
		return keys[i]
	}
	cache := node.Options().Addr + " " + script.Hash()
	cmds := make([]*redis.Cmd, len(args))
	withSource := !r.isNodeCached(cache)
	sent := time.Now()
	_, _ = node.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range args {
			if i == 0 && withSource {
				cmds[i] = script.Eval(ctx, p, keysOf(i), args[i]...)
			} else {
				cmds[i] = script.EvalSha(ctx, p, keysOf(i), args[i]...)
			}
		}
		return nil
	})
	var again []int
	for i, cmd := range cmds {
		if errs.IsNoScript(cmd.Err()) {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		_, _ = node.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, i := range again {
				cmds[i] = script.Eval(ctx, p, keysOf(i), args[i]...)
			}
			return nil
		})
	}
	r.setNodeCached(cache, slices.ContainsFunc(cmds, func(c *redis.Cmd) bool { return c.Err() == nil }))
	return cmds, sent
}

// answered is part of a renewal call, with the node's replies for it.
type answered struct {
	RenewCall
	res []int64
}

// splitUnsure splits call b, whose leases the node answered with res, into
// the leases it answered for (1 or 0) and a call of its own for each lease
// it answered -1 for. Each lease's call goes to the node that serves its
// slot, or on an ASK redirect to the node importing it: one call for many
// leases of a slot being migrated would fail with TRYAGAIN as soon as the
// keys it names were split between the two nodes, or one of them is gone.
func splitUnsure(b RenewCall, res []int64) (kept answered, unsure []RenewCall) {
	kept.Args = []any{b.Args[0]}
	k := 0
	for j, l := range b.Leases {
		n := 1 + len(l.Extra)
		keys, spec := b.Keys[k:k+n:k+n], b.Args[1+j]
		k += n
		if res[j] == -1 {
			unsure = append(unsure, RenewCall{Leases: []*Lease{l}, Keys: keys, Args: []any{b.Args[0], spec}})
			continue
		}
		kept.Leases = append(kept.Leases, l)
		kept.Keys = append(kept.Keys, keys...)
		kept.Args = append(kept.Args, spec)
		kept.res = append(kept.res, res[j])
	}
	return kept, unsure
}

func (r *Renewals) renewNodeScript() *redis.Script {
	if r.nodeScript != nil {
		return r.nodeScript
	}
	return scripts.RenewNode
}

// RejectsScriptFlags reports whether err is a server's refusal of a script
// that opens with a shebang: Redis before 7.0 fails to compile it, and
// Redis 7 names the shebang when it knows no such flag.
func RejectsScriptFlags(err error) bool {
	if !errs.IsReply(err) {
		return false
	}
	msg := strings.ToLower(err.Error())
	return strings.Contains(msg, "shebang") || strings.Contains(msg, "error compiling script")
}

func (r *Renewals) isNodeCached(addr string) bool {
	r.nodeMu.Lock()
	defer r.nodeMu.Unlock()
	return r.nodeCached[addr]
}

func (r *Renewals) setNodeCached(addr string, cached bool) {
	r.nodeMu.Lock()
	defer r.nodeMu.Unlock()
	if r.nodeCached == nil {
		r.nodeCached = map[string]bool{}
	}
	r.nodeCached[addr] = cached
}
