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
//     subscription (a sharded one, on slot migration), subscribe again
//     first.
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
	defer func() {
		if sub != nil {
			_ = sub.Close()
		}
	}()
	var msgs <-chan any
	resubscribe := func() error {
		if sub != nil {
			_ = sub.Close()
		}
		if sub, err = c.subscribe(ctx, op, name, channel); err != nil {
			return err
		}
		msgs = sub.ChannelWithSubscriptions(redis.WithChannelSize(16))
		return c.confirmed(ctx, op, name, msgs)
	}
	if err := resubscribe(); err != nil {
		return err
	}
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		if done, wait, err = try(tctx); err != nil || done {
			return err
		}
		if wait < 0 || wait > recheck {
			wait = recheck
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
				// its slot migrates or its shard fails over. Subscribe anew,
				// where the slot is served now, then retry at once.
				if err := resubscribe(); err != nil {
					return err
				}
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
// Redisson's subscriptionTimeout (7.5 s).
func (c *Client) confirmed(ctx context.Context, op, name string, msgs <-chan any) error {
	t := time.NewTimer(c.cfg.subWait)
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
