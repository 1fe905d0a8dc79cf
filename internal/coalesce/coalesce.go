// Package coalesce sends commands that many goroutines issue at the same time
// to Redis in shared pipelines.
//
// A caller finding fewer than the limit of pipelines in flight sends its
// command at once, together with any commands waiting, so a lone caller pays
// nothing extra. Otherwise it waits: when a pipeline in flight returns, the
// first waiting caller leads the next one, taking every command queued by
// then. Under load, one write and one read carry many commands, for the
// client and for redis-server alike, which is where the time goes for short
// commands.
//
// go-redis retries a whole pipeline when its first command fails with an
// error it deems retryable. Only commands whose retryable errors strike
// every command of a pipeline alike may be given to a Coalescer: LOADING,
// READONLY (all of dlock's are writes) and MASTERDOWN do, but TRYAGAIN,
// which Redis Cluster returns for one multi-key command during resharding,
// does not, so a Coalescer must not be used on a cluster client. Otherwise
// the others in the pipeline would run twice.
package coalesce

import (
	"context"
	"errors"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Coalescer batches concurrent commands on one go-redis client. It is safe
// for concurrent use; the zero value is not usable.
type Coalescer struct {
	rdb   redis.UniversalClient
	limit int

	mu       sync.Mutex
	inflight int     // pipelines being sent
	queue    []*call // callers waiting for a pipeline, oldest first
}

type call struct {
	ctx  context.Context
	cmd  redis.Cmder
	lead chan bool // true: send the queue; false: cmd has its reply
}

// New returns a Coalescer that keeps at most limit pipelines in flight on
// rdb (at least 1).
func New(rdb redis.UniversalClient, limit int) *Coalescer {
	return &Coalescer{rdb: rdb, limit: max(limit, 1)}
}

// Do sends cmd, alone or in a pipeline with others, and returns cmd.Err()
// once its reply (or error) is in. A command sent alone runs with ctx; a
// pipeline of several runs with a context that is never cancelled, since it
// serves many callers, so cmd must not rely on ctx to be cancelled. If every
// command of a pipeline has a deadline, the pipeline has the latest of them
// (which go-redis applies to the connection only with
// ContextTimeoutEnabled); otherwise it has none.
func (c *Coalescer) Do(ctx context.Context, cmd redis.Cmder) error {
	c.mu.Lock()
	if c.inflight < c.limit {
		// A slot is free, so nobody waits (a freed slot goes to the first
		// caller waiting): send at once, alone.
		c.inflight++
		c.mu.Unlock()
		c.send(ctx, cmd, nil)
		return cmd.Err()
	}
	me := &call{ctx: ctx, cmd: cmd, lead: make(chan bool, 1)}
	c.queue = append(c.queue, me)
	c.mu.Unlock()
	if !<-me.lead {
		return cmd.Err()
	}
	// Promoted: the slot passed to this caller, which sends its own command
	// and everything queued behind it.
	c.mu.Lock()
	others := c.queue
	c.queue = nil
	c.mu.Unlock()
	c.send(ctx, cmd, others)
	return cmd.Err()
}

// send runs own, the caller's command, with the others' commands in one
// pipeline, hands every other caller its reply, and then passes the
// in-flight slot on to the first caller waiting, or frees it. If sending
// panics (a hook, say), the others get an error and the slot still moves on
// before the panic goes up.
func (c *Coalescer) send(ctx context.Context, own redis.Cmder, others []*call) {
	sent := false
	defer func() {
		for _, cl := range others {
			if !sent {
				cl.cmd.SetErr(errPanicked)
			}
			cl.lead <- false
		}
		c.mu.Lock()
		if len(c.queue) == 0 {
			c.inflight--
			c.mu.Unlock()
			return
		}
		next := c.queue[0]
		c.queue = c.queue[1:]
		c.mu.Unlock()
		next.lead <- true
	}()
	if len(others) == 0 {
		_ = c.rdb.Process(ctx, own)
	} else {
		// Errors land on each command; Pipelined's is the first of them.
		pctx, cancel := batchContext(ctx, others)
		defer cancel()
		_, _ = c.rdb.Pipelined(pctx, func(p redis.Pipeliner) error {
			_ = p.Process(ctx, own)
			for _, cl := range others {
				_ = p.Process(ctx, cl.cmd)
			}
			return nil
		})
	}
	sent = true
}

// batchContext is the context of a pipeline that carries own's command
// (own is its caller's ctx) and the others': the latest of their deadlines
// when every one has a deadline, else no deadline; never cancelled.
func batchContext(own context.Context, others []*call) (context.Context, context.CancelFunc) {
	latest, ok := own.Deadline()
	if !ok {
		return context.Background(), func() {}
	}
	for _, cl := range others {
		d, has := cl.ctx.Deadline()
		if !has {
			return context.Background(), func() {}
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(context.Background(), latest)
}

var errPanicked = errors.New("coalesce: the pipeline this command shared panicked while sending")

// Run runs script as redis.Script.Run does: EVALSHA through Do, and EVAL of
// the source, sent on its own, when the server does not have the script
// cached (after a restart, a failover or SCRIPT FLUSH).
func (c *Coalescer) Run(ctx context.Context, script *redis.Script, keys []string, args ...any) *redis.Cmd {
	return c.RunBoxed(ctx, script, keys, nil, args...)
}

// RunBoxed is Run with the keys also given as boxed, the same strings as
// keys in []any, which a caller that runs scripts on the same keys again
// and again keeps, so that they are not converted for every call (nil:
// convert keys).
func (c *Coalescer) RunBoxed(ctx context.Context, script *redis.Script, keys []string, boxed []any, args ...any) *redis.Cmd {
	a := make([]any, 0, 3+len(keys)+len(args))
	a = append(a, "evalsha", script.Hash(), len(keys))
	if boxed != nil {
		a = append(a, boxed...)
	} else {
		for _, k := range keys {
			a = append(a, k)
		}
	}
	a = append(a, args...)
	cmd := redis.NewCmd(ctx, a...)
	if err := c.Do(ctx, cmd); err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
		return script.Eval(ctx, c.rdb, keys, args...)
	}
	return cmd
}
