package redisson

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// FencedLock is a handle on a Redisson RFencedLock: an RLock (same hash,
// holder fields, channel, unlock and watchdog, so it excludes Java RLock
// and RFencedLock handles of the name) whose every grant, re-entries
// included, takes the next number of the counter redisson_lock_token:{name}.
// Go and Java holders draw from that one counter, so tokens rise strictly
// across both: pass a hold's token to what the lock protects and have it
// refuse older ones.
//
// The counter never expires and is never reset by this package (Java's
// delete() deletes it, and numbering then starts again at 1).
type FencedLock struct{ l *Lock }

// FencedLock returns the handle of the RFencedLock called name.
func (c *Client) FencedLock(name string) *FencedLock {
	return &FencedLock{l: &Lock{c: c, name: name, fenced: true}}
}

// Name returns the lock's name.
func (f *FencedLock) Name() string { return f.l.name }

// WithLease returns a handle whose acquisitions take a fixed lease, as
// (*Lock).WithLease does. (Java's lockAndGetToken(lease) ignores its lease
// and uses the watchdog; Go honours it.)
func (f *FencedLock) WithLease(lease time.Duration) *FencedLock {
	return &FencedLock{l: f.l.WithLease(lease)}
}

// Lock blocks until the owner in ctx holds the lock, as (*Lock).Lock, and
// returns the token of this grant (Java's lockAndGetToken).
func (f *FencedLock) Lock(ctx context.Context) (token int64, err error) {
	return f.l.lock(ctx, "lock", "redisson.FencedLock.Lock")
}

// TryLock takes or re-enters the lock if it can at once, in one round
// trip, and returns the grant's token (Java's tryLockAndGetToken(0, …)).
// A lock held by another owner is (0, false, nil).
func (f *FencedLock) TryLock(ctx context.Context) (token int64, ok bool, err error) {
	ok, token, err = f.l.tryLock(ctx, "trylock", "redisson.FencedLock.TryLock")
	return token, ok, err
}

// Unlock undoes one hold, as (*Lock).Unlock.
func (f *FencedLock) Unlock(ctx context.Context) error { return f.l.Unlock(ctx) }

// ForceUnlock deletes the lock whoever holds it, as (*Lock).ForceUnlock;
// the token counter stays.
func (f *FencedLock) ForceUnlock(ctx context.Context) (bool, error) { return f.l.ForceUnlock(ctx) }

// IsLocked reports whether anyone holds the lock.
func (f *FencedLock) IsLocked(ctx context.Context) (bool, error) { return f.l.IsLocked(ctx) }

// HoldCount returns how many holds the owner in ctx has.
func (f *FencedLock) HoldCount(ctx context.Context) (int, error) { return f.l.HoldCount(ctx) }

// Extend sets the lease of the owner's hold, as (*Lock).Extend.
func (f *FencedLock) Extend(ctx context.Context, lease time.Duration) error {
	return f.l.Extend(ctx, lease)
}

// Lost returns the channel closed if the owner's hold is lost, as
// (*Lock).Lost.
func (f *FencedLock) Lost(ctx context.Context) <-chan struct{} { return f.l.Lost(ctx) }

// HoldContext returns a context cancelled when the owner's hold ends, as
// (*Lock).HoldContext.
func (f *FencedLock) HoldContext(parent context.Context) (context.Context, context.CancelFunc) {
	return f.l.HoldContext(parent)
}

// Token returns the latest token issued for the name, by any holder, Go or
// Java (Java's getToken), or 0 when none was: not necessarily the caller's.
func (f *FencedLock) Token(ctx context.Context) (int64, error) {
	if err := f.l.c.check("token", f.l.name); err != nil {
		return 0, err
	}
	n, err := f.l.c.rdb.Get(ctx, tokenKey(f.l.name)).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, redisErr("token", f.l.name, kindName, err)
	}
	return n, nil
}
