package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/wire"
)

// Replica acknowledgement (WithSyncReplicas). WAIT counts the replicas that
// acknowledged the writes made on its own connection before it, so a grant
// is followed by WAIT on the connection that wrote it: each try of an
// acquisition runs its script and WAIT in one pipeline (one connection), and
// the lifecycle (Acquisition.Granted) keeps a grant only when WAIT counted
// enough replicas. A grant that a release wrote, from another connection, is
// claimed with a try instead of taken from the release message
// (Acquisition.handedGrant): the claim writes after the hand-over, and since
// a replica applies the master's writes in order, a WAIT that covers the
// claim covers the hand-over too.

// SyncReplicas is the WithSyncReplicas setting; Replicas is 0 when off.
type SyncReplicas struct {
	Replicas int
	Timeout  time.Duration
}

// replicaAck is what the WAIT sent after one try answered.
type replicaAck struct {
	sent  bool  // a WAIT followed the try's script
	acked int64 // replicas that acknowledged
	err   error // WAIT's error, or the pipeline's
}

// ackKey marks a try's context: Core.Script then sends the script with a
// WAIT behind it and records the answer in the context's *replicaAck.
type ackKey struct{}

// TryCtx returns the context a try's script runs with: a.NC, which with
// WithSyncReplicas also asks for a WAIT behind the script.
func (a *Acquisition) TryCtx() context.Context {
	if a.H.C.Cfg.Sync.Replicas == 0 {
		return a.NC
	}
	a.ack = replicaAck{}
	return context.WithValue(a.NC, ackKey{}, &a.ack)
}

// replicated reports, with WithSyncReplicas, whether enough replicas
// acknowledged the grant the last try got; if not, the error the call
// returns once the grant is given back. It consumes the answer, so that
// every grant needs a WAIT of its own.
func (a *Acquisition) replicated() error {
	want := a.H.C.Cfg.Sync
	if want.Replicas == 0 {
		return nil
	}
	ack := a.ack
	a.ack = replicaAck{}
	var detail string
	switch {
	case !ack.sent:
		detail = "no WAIT followed the grant" // a try that did not use TryCtx
	case ack.err != nil:
		detail = "WAIT failed"
	case ack.acked < int64(want.Replicas):
		detail = fmt.Sprintf("%d of %d replicas acknowledged within %v", ack.acked, want.Replicas, want.Timeout)
	default:
		return nil
	}
	wrapped := []error{errs.ErrNotReplicated, errs.ErrNotObtained}
	if ack.err != nil {
		wrapped = append(wrapped, ack.err)
	}
	return errs.Op(a.Op, a.H.Name, detail+"; the grant was given back", wrapped...)
}

// scriptAcked runs script s as Core.Script does, followed by WAIT on the
// same connection, and records WAIT's answer in ack. It goes to the master
// that holds keys[0] (on a cluster or a ring, that key's node), never through
// the coalescer, whose lone calls do not use a pipeline.
func (c *Core) scriptAcked(ctx context.Context, ack *replicaAck, s *redis.Script, keys []string, args []any) *redis.Cmd {
	node, err := c.nodeOf(ctx, keys[0])
	if err != nil {
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(err)
		ack.sent, ack.err = true, err
		return cmd
	}
	cmd, wait := c.sendAcked(ctx, node, s.EvalSha, keys, args)
	if errs.IsNoScript(cmd.Err()) {
		cmd, wait = c.sendAcked(ctx, node, s.Eval, keys, args)
	}
	ack.sent, ack.acked, ack.err = true, wait.Val(), wait.Err()
	if cc, ok := c.RDB.(*redis.ClusterClient); ok && isRedirect(cmd.Err()) {
		cc.ReloadState(ctx) // the next try asks the slot's new master
	}
	return cmd
}

type evalFunc func(ctx context.Context, c redis.Scripter, keys []string, args ...any) *redis.Cmd

// sendAcked sends one pipeline: the script, by eval, then WAIT.
func (c *Core) sendAcked(ctx context.Context, node pipelined, eval evalFunc, keys []string, args []any) (*redis.Cmd, *redis.IntCmd) {
	want := c.Cfg.Sync
	wait := redis.NewIntCmd(ctx, "wait", want.Replicas, wire.Millis(want.Timeout))
	var cmd *redis.Cmd
	_, _ = node.Pipelined(ctx, func(p redis.Pipeliner) error {
		cmd = eval(ctx, p, keys, args...)
		return p.Process(ctx, wait)
	})
	return cmd, wait
}

// pipelined is what sends a pipeline on one connection to one server.
type pipelined interface {
	Pipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error)
}

// nodeOf returns the client of the master that holds key: on a cluster the
// master of its slot, on a ring its shard, else the Core's own.
func (c *Core) nodeOf(ctx context.Context, key string) (pipelined, error) {
	switch rdb := c.RDB.(type) {
	case *redis.ClusterClient:
		return rdb.MasterForKey(ctx, key)
	case *redis.Ring:
		return rdb.GetShardClientForKey(key)
	}
	return c.RDB, nil
}

// isRedirect reports whether err is Redis Cluster's MOVED or ASK.
func isRedirect(err error) bool {
	code, _ := errs.Classify(err)
	return code == "MOVED" || code == "ASK"
}

// checkSyncReplicas checks WithSyncReplicas against the go-redis client:
// the reply to WAIT, up to the timeout after the script, must come before
// the client's read deadline, with room to spare.
func checkSyncReplicas(rdb redis.UniversalClient, want SyncReplicas) error {
	if want.Replicas == 0 {
		return nil
	}
	rt := readTimeout(rdb)
	if rt > 0 && want.Timeout > rt/2 {
		return errs.Invalidf("sync replicas: timeout %v is over half the redis client's read timeout %v", want.Timeout, rt)
	}
	return nil
}

// readTimeout returns rdb's read timeout, 0 when it has none or it is not
// known.
func readTimeout(rdb redis.UniversalClient) time.Duration {
	switch r := rdb.(type) {
	case *redis.Client: // options as normalized: 0 or less is none
		return max(r.Options().ReadTimeout, 0)
	case *redis.ClusterClient:
		return max(r.Options().ReadTimeout, 0)
	case *redis.Ring: // options as given: 0 is go-redis's default
		if rt := r.Options().ReadTimeout; rt != 0 {
			return max(rt, 0)
		}
		return 5 * time.Second
	}
	return 0
}
