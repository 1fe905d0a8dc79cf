package dlock

import (
	"context"
	"sync"

	"github.com/dlock-go/dlock/internal/errs"
)

// Locker returns a sync.Locker view of the Mutex, for code that takes one
// (sync.Cond, libraries that accept a sync.Locker), as etcd's
// concurrency.NewLocker does.
//
// sync.Locker has no context and no error, so Lock blocks until it holds
// the lock or fails, with no deadline, and both methods PANIC on any error
// Lock or Unlock would return: a Redis failure, a closed or invalid Client,
// an invalid name, or an Unlock of a hold that is not held or was lost. The
// panic value is that error (matching ErrInvalid, ErrClosed, ErrNotHeld,
// ErrLost... under errors.Is). The view knows nothing of lost holds: code
// that must stop when the lock is lost should use the Mutex itself, with
// Lost or HoldContext. Locker of a nil *Mutex returns a view whose methods
// panic with an error matching ErrInvalid.
func (m *Mutex) Locker() sync.Locker { return mutexLocker{m} }

type mutexLocker struct{ m *Mutex }

func (l mutexLocker) Lock() {
	if l.m == nil {
		panic(errs.Invalidf("Locker of a nil *Mutex"))
	}
	if err := l.m.Lock(context.Background()); err != nil {
		panic(err)
	}
}

func (l mutexLocker) Unlock() {
	if l.m == nil {
		panic(errs.Invalidf("Locker of a nil *Mutex"))
	}
	if err := l.m.Unlock(context.Background()); err != nil {
		panic(err)
	}
}
