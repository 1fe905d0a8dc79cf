package redlock

// Calls on every master of a Redlock at once: the per-master timeout, the
// fan-out that waits for the answers, and the release on one master.

import (
	"context"
	"errors"
	"time"
)

// release frees the key on one master if id holds it there.
func (rm *Mutex) release(node *master, id string) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), rm.nodeTimeout())
	defer cancel()
	return rm.releaseCtx(ctx, node, id)
}

func (rm *Mutex) releaseCtx(ctx context.Context, node *master, id string) (bool, error) {
	n, err := node.run(ctx, rm.keys, "u", rm.h.Kind, id, 0, "0", rm.r.Core.ID).Int64()
	return n == 1, err
}

func (rm *Mutex) nodeTimeout() time.Duration {
	ttl, _ := rm.h.Terms()
	return nodeTimeout(ttl)
}

// errNodeTimeout is the error of a master that did not answer in time.
var errNodeTimeout = errors.New("dlock: redlock: master did not answer within the node timeout")

// overrun is how long a call waits for a master's answer: its node
// timeout, and a quarter more, since go-redis may overrun a context's
// deadline while it sets up a connection.
func overrun(timeout time.Duration) time.Duration { return timeout + timeout/4 + time.Millisecond }

// fanOut runs f on every master of r at once, each with a context that
// ends after timeout, and returns the results by master; answered[i] is
// false for a master that did not answer in time (its call goes on in the
// background, tracked by goCall, and its result is dropped).
func fanOut[T any](r *Redlock, parent context.Context, timeout time.Duration, f func(ctx context.Context, n *master) T) (res []T, answered []bool) {
	type result struct {
		i int
		v T
	}
	nodes := r.nodes
	ch := make(chan result, len(nodes))
	for i, n := range nodes {
		r.goCall(func() {
			ctx, cancel := context.WithTimeout(parent, timeout)
			defer cancel()
			ch <- result{i, f(ctx, n)}
		})
	}
	res, answered = make([]T, len(nodes)), make([]bool, len(nodes))
	timer := time.NewTimer(overrun(timeout))
	defer timer.Stop()
	for range nodes {
		select {
		case r := <-ch:
			res[r.i], answered[r.i] = r.v, true
		case <-timer.C:
			return res, answered
		}
	}
	return res, answered
}

// onEvery runs f on every master at once, each with the node timeout, and
// counts the masters where it returned true and those where it failed.
func (rm *Mutex) onEvery(f func(ctx context.Context, n *master) (bool, error)) (ones, fails int, lastErr error) {
	type out struct {
		ok  bool
		err error
	}
	res, answered := fanOut(rm.r, context.Background(), rm.nodeTimeout(), func(ctx context.Context, n *master) out {
		ok, err := f(ctx, n)
		return out{ok, err}
	})
	for i, r := range res {
		switch {
		case !answered[i]:
			fails++
			lastErr = errNodeTimeout
		case r.err != nil:
			fails++
			lastErr = r.err
		case r.ok:
			ones++
		}
	}
	return ones, fails, lastErr
}

// goCall runs f, a call on a master, on a goroutine of its own that Close
// waits for. go-redis applies a context's deadline to a request's socket
// I/O only with Options.ContextTimeoutEnabled; without it a call to a
// stalled master lasts until the client's ReadTimeout, whatever the node
// timeout, and Close waits that long.
func (r *Redlock) goCall(f func()) {
	r.callsMu.Lock()
	r.calls++
	r.callsMu.Unlock()
	go func() {
		defer func() {
			r.callsMu.Lock()
			if r.calls--; r.calls == 0 {
				r.callsIdle.Broadcast()
			}
			r.callsMu.Unlock()
		}()
		f()
	}()
}

// awaitCalls waits until no call started by goCall is running.
func (r *Redlock) awaitCalls() {
	r.callsMu.Lock()
	for r.calls > 0 {
		r.callsIdle.Wait()
	}
	r.callsMu.Unlock()
}
