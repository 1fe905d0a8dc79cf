package dlock

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/pubsub"
)

// Sentinel errors. Test for them with errors.Is: dlock wraps them with the
// operation and the lock's name.
var (
	// ErrNotObtained means the lock or permit was not acquired: TryLock found
	// it taken, or a blocking call's context ended first. In the second case
	// the error also matches the context's error (context.Canceled or
	// context.DeadlineExceeded).
	ErrNotObtained = errors.New("dlock: not obtained")

	// ErrNotHeld means an Unlock or Release found nothing of the caller's to
	// release. Nothing was changed.
	ErrNotHeld = errors.New("dlock: not held")

	// ErrLost means a hold ended without its holder releasing it: the lease
	// expired, the key was deleted, or renewals failed for longer than the
	// lease. It is the cause of a hold context's cancellation, and Unlock of a
	// lost hold returns it.
	ErrLost = errors.New("dlock: lock lost")

	// ErrUpgrade means an owner holding an RWMutex read lock asked for the
	// write lock, which would wait for itself. Release the read lock first,
	// or take the write lock first and downgrade.
	ErrUpgrade = errors.New("dlock: read lock cannot be upgraded")

	// ErrClosed means the Client was closed.
	ErrClosed = errors.New("dlock: client closed")

	// ErrInvalid means bad input: an empty name, a non-positive lease or
	// timeout, an empty owner, or a nil Redis client. Nothing was sent to
	// Redis.
	ErrInvalid = errors.New("dlock: invalid argument")
)

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// notObtained is the error of a blocking acquisition whose context ended.
func notObtained(op, name string, ctx context.Context) error {
	return fmt.Errorf("dlock: %s %q: %w: %w", op, name, ErrNotObtained, ctx.Err())
}

// redisErr wraps an error from Redis with the operation and lock name. A
// WRONGTYPE reply gets a plain explanation, since it means the name collides
// with a key that is not a dlock lock of this kind.
func redisErr(op, name, key string, err error) error {
	if strings.HasPrefix(err.Error(), "WRONGTYPE") || strings.Contains(err.Error(), " WRONGTYPE ") {
		return fmt.Errorf("dlock: %s %q: key %q exists and is not a lock of this kind: %w", op, name, key, err)
	}
	return fmt.Errorf("dlock: %s %q: %w", op, name, err)
}

// isRedisError reports whether err is a reply from Redis, as opposed to a
// transport failure after which a command's outcome is unknown.
func isRedisError(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}

// closedErr is the error of a call that met a closed Client.
func closedErr(op, name string) error {
	return fmt.Errorf("dlock: %s %q: %w", op, name, ErrClosed)
}

// waitErr maps errors of the wait machinery to dlock's sentinels.
func waitErr(op, name string, err error) error {
	if errors.Is(err, ErrClosed) || errors.Is(err, pubsub.ErrClosed) {
		return closedErr(op, name)
	}
	return fmt.Errorf("dlock: %s %q: subscribe: %w", op, name, err)
}
