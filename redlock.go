package dlock

import (
	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/engine"
	"github.com/dlock-go/dlock/internal/redlock"
	"github.com/dlock-go/dlock/internal/telemetry"
	"github.com/dlock-go/dlock/internal/wire"
)

// Redlock is a Mutex over N independent Redis masters (N odd, at least 3),
// after the Redlock algorithm: a lock is held when a majority of the masters
// (N/2+1, the quorum) granted it within its validity. It survives the loss
// of up to N/2 masters, which one Redis, even with replicas, does not.
//
// Make one with NewRedlock and take Mutex handles from it; a Redlock Mutex
// is the same *Mutex type as a Client's and behaves like one (Lock, TryLock,
// Unlock, Extend, Lost, HoldContext, Token, spans), with these differences:
//
//   - Acquiring. Each try asks every master at once, each with a timeout of
//     its own, the node timeout (a tenth of the lease, between 5ms and
//     500ms): the call waits for a master's answer that long (and a quarter
//     more), then counts it as failed. The request itself carries the node
//     timeout as its context's deadline, which go-redis applies to the
//     socket only on clients with Options.ContextTimeoutEnabled; without it
//     a request to a stalled master goes on in the background until the
//     client's ReadTimeout (see Close). A try is granted as soon as a quorum
//     granted it. Lock and TryLock return when their context ends, even
//     with requests out: the try is then given back in the background. The hold's validity is measured on the
//     monotonic clock from when the try was sent: lease − elapsed − drift
//     (1% of the lease and 2ms). A try that fails to reach the quorum, or
//     whose validity is below a third of the lease, is given back on every
//     master, including masters that answer late.
//   - Renewing. The watchdog renews the hold on every master in parallel,
//     and re-acquires it, with the same token, on masters that lost the key
//     (restarted or flushed) while the quorum still holds it. The hold's
//     deadline moves forward only when a quorum renewed it. When a renewal
//     shows that a quorum can no longer be kept (too many masters no longer
//     have the key), or the deadline passes because renewals did not reach
//     a quorum in time, the hold is lost: Lost fires and hold contexts are
//     cancelled, at the latest when the quorum's leases may have run out.
//   - Waiting. A blocked Lock waits for a release message from any master
//     (pub/sub on every master, no polling). Waiters of one Redlock are
//     woken in arrival order; across processes, whoever gets a quorum first
//     wins: there is no queue in Redis, since queues on independent masters
//     would not agree on an order. A try that split the votes with another
//     waits a short random time before trying again.
//   - Fencing tokens: see the section below.
//   - IsLocked and TTL report what a quorum of the masters says; ForceUnlock
//     frees the lock on every master.
//
// # Fencing tokens
//
// Each master keeps, per lock name, F: the highest token it has seen, in a
// key that expires a minute after the lease of the
// grant that last raised it, so that no counter is kept for good. A try
// proposes a token P (the caller's clock in microseconds, or one more than
// the last token this Redlock saw if that is greater); each master that
// grants it issues max(F+1, P) and raises F to it. The hold's token T is
// the maximum over the masters that granted it; before the call returns, T
// is written back (F := max(F, T), only while the key is still the
// caller's) to the granting masters that issued less, and the acquisition
// succeeds only if a quorum has F >= T: the set W of masters that saw T is
// a majority.
//
// Why tokens strictly increase: let hold B follow hold A (B was granted
// after A ended, on a quorum G). W(A) and G are both majorities, so they
// share a master m. On m, A's grant or write-back (made while m's key was
// A's) came before B's grant (made when m's key was free again), so when B
// was granted, m's F was at least T(A), and m issued B at least T(A)+1;
// T(B), a maximum that includes m's, is greater than T(A).
//
// Unless m's F expired meanwhile: then B was granted more than a lease and
// a minute after A's grant. Every proposal is a clock reading (or a token
// seen, itself from one), and a token exceeds the proposals behind it only
// by one per grant, so if the callers' clocks agree within 30 seconds,
// T(A) is at most 30 seconds ahead of the time of A's grant, and B's
// proposal, at least a minute later, is at most 30 seconds behind: T(B) >
// T(A) all the same. That is the assumption of the expiry.
//
// The other assumption: m kept its data between the two. A master that
// loses it (a restart without persistence, a FLUSHALL) forgets F. To keep the
// argument, such a master must stay out, after restarting, for at least one
// maximum lease (the Redlock "delayed restart"), and the masters' and
// clients' clocks must agree within that lease: then any hold A whose token
// only m still remembered was granted at least a lease before B, and B's
// proposal P, a clock reading, already exceeds T(A). Without the delayed
// restart, tokens may repeat, and exclusion itself may fail (m may help a
// second caller reach a quorum while A still holds). The delayed restart is
// the operator's to arrange (or persistence with appendfsync always); dlock
// cannot tell a master that restarted empty from a new one. What dlock does
// for a master that comes back empty: the holder's watchdog re-acquires the
// key there with its own token T, which also raises that master's F to T,
// and a master's F never helps issue a token below it.
type Redlock struct {
	r *redlock.Redlock
}

// NewRedlock returns a Redlock over masters, independent Redis masters (no
// two may be the same server, nor replicas of each other), which must be an
// odd number of at least 3. Options are those of New, and apply to every
// master: WithWatchdogTimeout sets the lease of watchdog holds, and so on.
// WithSyncReplicas does not apply.
//
// NewRedlock sends nothing. Fewer than 3 masters, an even number, a nil
// client, two clients on the same address, a cluster or ring client, or an
// invalid option make every later call (on the Redlock and its handles)
// return an error wrapping ErrInvalid. dlock does not close the masters.
//
// Give the masters' clients ContextTimeoutEnabled: true, so that a request
// to a master that stalls ends at its node timeout (see Acquiring below);
// NewRedlock logs a warning (WithLogger) for a *redis.Client without it.
func NewRedlock(masters []redis.UniversalClient, opts ...Option) *Redlock {
	cfg := buildConfig(opts)
	tel := telemetry.New(cfg.tracerProvider, cfg.meterProvider, cfg.nameAttr)
	return &Redlock{r: redlock.New(masters, cfg.Config, tel, wire.NewClientID(cfg.name), cfg.err)}
}

// Mutex returns a handle on the lock called name over the Redlock's masters.
// It sends nothing. WithLease gives holds a fixed lease; WithHandleOwner does
// not apply. An empty name or an invalid option makes every method return an
// error wrapping ErrInvalid.
func (r *Redlock) Mutex(name string, opts ...LockOption) *Mutex {
	lc := buildLockConfig(opts)
	h := r.r.Core.NewHandle(telemetry.KindMutex, name, lc.lease, lc.renewed, lc.err)
	slot := &engine.Slot{}
	return &Mutex{h: h, slot: slot, lk: r.r.NewMutex(h, slot)}
}

// Close stops the watchdog and the pub/sub connections, and waits for their
// goroutines to exit, as Client.Close does: blocked calls return ErrClosed,
// later calls fail with ErrClosed, and holds still open are reported lost
// (they expire by their leases). It also waits for the requests still out
// on the masters (a master's late answer to a try, a give-back): with
// ContextTimeoutEnabled on the masters' clients each ends by its node
// timeout; without it, a request to a stalled master may last until its
// client's ReadTimeout (forever with -1), and Close waits as long, or a few
// times as long when a give-back follows a late answer. It does not close
// the masters' clients. Close is idempotent.
func (r *Redlock) Close() error { return r.r.Close() }
