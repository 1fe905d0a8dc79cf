package redisson

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/errs"
)

// attempt is one try of a blocking call: done when it succeeded; else wait
// is how long the thing waited for may stay unavailable (a lock's PTTL), or
// negative when unknown.
type attempt func(ctx context.Context) (done bool, wait time.Duration, err error)

// await runs Redisson's waiting protocol (docs/redisson.md §7.2):
//
//  1. Try. Done when it succeeds.
//  2. Subscribe to channel, and wait for the server's confirmation. The
//     subscription is the Client's, shared by its waiting calls on channel
//     (see subscriptions): a call joining one confirmed already waits for
//     nothing.
//  3. Try again: a release between 1 and 2 published to nobody, or before
//     this call joined.
//  4. Wait for a wake-up, or for the wait the last try returned (a lock's
//     lease running out), capped at recheck; then go to 3. A wake-up is a
//     message on channel (any message: it is a hint to retry), a
//     confirmation (after a reconnect, go-redis subscribes again: a release
//     meanwhile was unheard), or the server ending the subscription (a
//     sharded one ends on slot migration): then subscribe again after the
//     next try, and go to 3 once it is confirmed.
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
	w, err := c.join(ctx, op, name, channel)
	if err != nil {
		return err
	}
	defer c.leave(w)
	if err := c.subscribed(ctx, op, name, w, c.cfg.subWait); err != nil {
		return err
	}
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		if done, wait, err = try(tctx); err != nil || done {
			return err
		}
		state := c.subs.state(w)
		if state != confirmed {
			// Subscribe again, or wait for another call doing so. Where the
			// channel's slot is served now may not be known yet: the try
			// above met a MOVED, and the cluster client reloads its map
			// meanwhile. Give a subscription a moment, and retry the whole
			// step soon when it gets no confirmation.
			err := c.subscribed(ctx, op, name, w, resubscribeWait)
			switch {
			case err == nil:
				continue // a release may have gone unheard: try again now
			case ctx.Err() != nil || c.ctx.Err() != nil:
				return err
			}
			if cc, ok := c.rdb.(*redis.ClusterClient); ok {
				cc.ReloadState(ctx)
			}
		}
		if wait < 0 || wait > recheck {
			wait = recheck
		}
		if state != confirmed {
			wait = min(wait, resubscribeWait)
		}
		t.Reset(max(wait, time.Millisecond))
		select {
		case <-ctx.Done():
			return errs.NotObtained(op, name, ctx)
		case <-c.closing:
			return errs.ClosedOp(op, name)
		case <-w.wake:
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
