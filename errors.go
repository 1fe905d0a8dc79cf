package dlock

import "github.com/dlock-go/dlock/internal/errs"

// Sentinel errors. Test for them with errors.Is: dlock wraps them with the
// operation and the lock's name.
var (
	// ErrNotObtained means the lock or permit was not acquired: TryLock found
	// it taken, or a blocking call's context ended first. In the second case
	// the error also matches the context's error (context.Canceled or
	// context.DeadlineExceeded).
	ErrNotObtained = errs.ErrNotObtained

	// ErrNotHeld means an Unlock or Release found nothing of the caller's to
	// release. Nothing was changed.
	ErrNotHeld = errs.ErrNotHeld

	// ErrLost means a hold ended without its holder releasing it: the lease
	// expired, the key was deleted, or renewals failed for longer than the
	// lease. It is the cause of a hold context's cancellation, and Unlock of a
	// lost hold returns it.
	ErrLost = errs.ErrLost

	// ErrUpgrade means an owner holding an RWMutex read lock asked for the
	// write lock, which would wait for itself. Release the read lock first,
	// or take the write lock first and downgrade.
	ErrUpgrade = errs.ErrUpgrade

	// ErrNotFound means Client.Status or Client.ForceUnlock found no
	// primitive by that name.
	ErrNotFound = errs.ErrNotFound

	// ErrNoLeader means Election.Leader found nobody leading.
	ErrNoLeader = errs.ErrNoLeader

	// ErrNotReplicated means an acquisition on a Client made with
	// WithSyncReplicas was granted, but fewer replicas than it asks for
	// acknowledged the grant within its timeout (or the WAIT that asks them
	// failed). The grant was given back before the call returned, so the
	// caller holds nothing; the error also matches ErrNotObtained. A blocking
	// call fails with it rather than trying again.
	ErrNotReplicated = errs.ErrNotReplicated

	// ErrClosed means the Client was closed.
	ErrClosed = errs.ErrClosed

	// ErrUnavailable means Redis could not be reached or could not serve
	// the call: a dial, write or read failed or timed out, go-redis's client
	// was closed or its pool had no connection to give, or Redis answered
	// that it cannot serve now (LOADING, BUSY, MASTERDOWN, CLUSTERDOWN,
	// READONLY). The error also matches the error underneath. Whether the
	// call took effect is then unknown; each call says what it does about it
	// (an acquisition gives back whatever it may have been granted, a
	// release leaves the hold to end by its lease).
	//
	// How long a call takes to fail is go-redis's to say, since a request
	// whose outcome dlock must know is not cut short by the caller's ctx:
	// with go-redis's defaults, about 2 s when connections are refused, and
	// up to ReadTimeout (3 s) for each of 1+MaxRetries (4) attempts when
	// packets are dropped. Lower those options on the go-redis client for a
	// quicker answer. A hold's Lost never waits for them: it fires at the
	// hold's deadline whatever is in flight.
	ErrUnavailable = errs.ErrUnavailable

	// ErrInvalid means bad input: an empty name, a non-positive lease or
	// timeout, an empty owner, a nil Redis client, or a name whose key holds
	// something other than a primitive of the kind asked for. Nothing was
	// written to Redis.
	ErrInvalid = errs.ErrInvalid
)
