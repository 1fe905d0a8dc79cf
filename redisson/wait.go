package redisson

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/errs"
)

// attempt is one try of a blocking call: done when it succeeded; else wait
// is how long the thing waited for may stay unavailable (a lock's PTTL), or
// negative when unknown.
type attempt func(ctx context.Context) (done bool, wait time.Duration, err error)

// await runs Redisson's waiting protocol (docs/redisson.md §7.2):
//
//  1. Try. Done when it succeeds.
//  2. Subscribe to channel, and wait for the server's confirmation.
//  3. Try again: a release between 1 and 2 published to nobody.
//  4. Wait for a message on channel (any message: it is a hint to retry),
//     or for the wait the last try returned (a lock's lease running out),
//     capped at recheck; then go to 3. When the server ends the
//     subscription (a sharded one ends on slot migration), subscribe again
//     after the next try, and go to 3 once it is confirmed.
//
// Tries run with ctx's values but without its cancellation, so that a grant
// is never half-seen: a try that Redis answered is always recorded. ctx is
// checked between tries; when it ends first the error matches
// dlock.ErrNotObtained and ctx.Err().
func (c *Client) await(ctx context.Context, op, name, channel string, recheck time.Duration, try attempt) error {
	tctx := context.WithoutCancel(ctx)
	done, wait, err := try(tctx)
	if err != nil || done {
		return err
	}
	var sub *redis.PubSub
	var msgs <-chan any
	drop := func() {
		if sub != nil {
			_ = sub.Close()
		}
		sub, msgs = nil, nil
	}
	defer drop()
	subscribe := func(confirm time.Duration) error {
		drop()
		s, err := c.subscribe(ctx, op, name, channel)
		if err != nil {
			return err
		}
		sub = s
		msgs = sub.ChannelWithSubscriptions(redis.WithChannelSize(16))
		return c.confirmed(ctx, op, name, msgs, confirm)
	}
	if err := subscribe(c.cfg.subWait); err != nil {
		return err
	}
	lapsed := false // the server ended the subscription
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		if done, wait, err = try(tctx); err != nil || done {
			return err
		}
		if lapsed {
			// Where the channel's slot is served now may not be known yet:
			// the try above met a MOVED, and the cluster client reloads its
			// map meanwhile. Give a subscription a moment, and retry the
			// whole step soon when it gets no confirmation.
			err := subscribe(resubscribeWait)
			switch {
			case err == nil:
				lapsed = false
				continue // a release may have gone unheard: try again now
			case ctx.Err() != nil || c.ctx.Err() != nil:
				return err
			}
			drop()
			if cc, ok := c.rdb.(*redis.ClusterClient); ok {
				cc.ReloadState(ctx)
			}
		}
		if wait < 0 || wait > recheck {
			wait = recheck
		}
		if lapsed {
			wait = min(wait, resubscribeWait)
		}
		t.Reset(max(wait, time.Millisecond))
		select {
		case <-ctx.Done():
			return errs.NotObtained(op, name, ctx)
		case <-c.closing:
			return errs.ClosedOp(op, name)
		case m := <-msgs: // a message, or a re-subscription after a reconnect
			if s, ok := m.(*redis.Subscription); ok && (s.Kind == "sunsubscribe" || s.Kind == "unsubscribe") {
				// The server ended the subscription: a sharded one ends when
				// its slot migrates or its shard fails over.
				drop()
				lapsed = true
			}
		case <-t.C:
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
	}
}

// resubscribeWait bounds each attempt to subscribe again after the server
// ended a subscription.
const resubscribeWait = 500 * time.Millisecond

// subscribe opens a pub/sub connection subscribed to channel, sharded or
// classic as the Client publishes. Every waiter has its own, as each Java
// waiter thread shares its client's one: either way a message reaches
// every subscribed waiter.
func (c *Client) subscribe(ctx context.Context, op, name, channel string) (*redis.PubSub, error) {
	sharded, err := c.shardedPubSub(ctx)
	if err != nil {
		return nil, redisErr(op, name, "redisson", err)
	}
	if sharded {
		return c.rdb.SSubscribe(ctx, channel), nil
	}
	return c.rdb.Subscribe(ctx, channel), nil
}

// confirmed waits for the server to confirm the subscription, as long as
// limit (Redisson's subscriptionTimeout is 7.5 s).
func (c *Client) confirmed(ctx context.Context, op, name string, msgs <-chan any, limit time.Duration) error {
	t := time.NewTimer(limit)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return errs.NotObtained(op, name, ctx)
		case <-c.closing:
			return errs.ClosedOp(op, name)
		case <-t.C:
			return errs.Op(op, name, "the subscription was not confirmed in time", dlock.ErrUnavailable)
		case m := <-msgs:
			if _, ok := m.(*redis.Subscription); ok {
				return nil
			}
		}
	}
}
