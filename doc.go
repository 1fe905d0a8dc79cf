// Package dlock provides distributed synchronization primitives on Redis for
// Go services that run as several processes: what sync.Mutex gives inside one
// process, across all of them.
//
// # Getting started
//
// Make one Client per process on a go-redis client and share it:
//
//	c := dlock.New(rdb) // *redis.Client, *redis.ClusterClient, failover client
//	defer c.Close()
//
//	m := c.Mutex("orders:42")
//	if err := m.Lock(ctx); err != nil {
//		return err // ctx ended (errors.Is(err, dlock.ErrNotObtained)) or Redis failed
//	}
//	defer m.Unlock(ctx)
//
// The primitives:
//
//   - Mutex: a plain lock that replaces sync.Mutex. One handle may be shared
//     by goroutines. Blocked callers queue in Redis and are handed the lock
//     in arrival order; a handle hands it on to its own waiting goroutines
//     first, a bounded number of times (see WithCohort, WithoutCohort).
//   - ReentrantMutex: a lock that counts holds per owner, so nested business
//     logic that passes its context along (see WithOwner) re-enters.
//   - RWMutex: many readers or one writer, reentrant per owner, fair to both
//     sides as sync.RWMutex is; each reader has its own lease.
//   - Semaphore: counting permits that are leases, served in arrival order.
//   - CountDownLatch: wait until a shared count reaches zero.
//   - MultiLock: several Mutexes held together, all or none, taken in name
//     order so that overlapping sets never deadlock.
//   - Election: one leader among campaigners, as etcd's Election.
//
// A Mutex's hold can be handed to another process (Mutex.HandOver,
// Client.ReleaseRef, Client.ExtendRef), and Mutex.Locker adapts a Mutex to
// sync.Locker.
//
// Every acquisition has a fencing token (Mutex.Token and the like), which
// package fence lets the protected resource check.
//
// # How it works
//
// Every state change is one Lua script (see internal/scripts, where each
// file states its KEYS, ARGV and return values), run by EVALSHA with an EVAL
// fallback. An uncontended Lock and Unlock cost one round trip each, and
// calls that goroutines of one Client make at the same moment share
// pipelines.
//
// A blocked Lock does not poll. It waits on the Client's single pub/sub
// connection, with a timer at the holder's remaining lease as the fallback.
// It also joins the lock's queue in Redis; a release hands the lock to the
// first live waiter there (to every queued reader, after an RWMutex writer)
// and tells it so: a Mutex waiter, or a ReentrantMutex owner or RWMutex
// writer waiting alone on its Client, returns holding the lock without
// another round trip; other owners' waiters and readers claim it with one.
// A Semaphore's release grants the permits it frees to the requests they
// serve, in queue order, and tells each, which returns holding them. A
// waiter subscribes before its last try, and a
// re-subscription after a dropped connection makes every waiter look again,
// so neither a lost message nor a killed connection strands a waiter.
//
// Each primitive's keys say what kind they are: a name that another kind of
// primitive, or another program, uses gets an error naming the key, before
// anything is written.
//
// A hold taken without WithLease gets the watchdog timeout as its lease
// (WithWatchdogTimeout, default 30s). The Client's watchdog renews all such
// holds once every third of that, at a fixed rate whatever a round of
// renewals costs, 100 keys per script call, in rounds that never wait for
// one another. An explicit WithLease hold is never renewed.
//
// # Lost holds
//
// Every hold (and every permit, and every waiting caller's place in a
// queue) has a deadline on this process's monotonic clock: the time at which
// the request that last granted or renewed it was sent, plus its lease, less
// a margin of 1% of the lease and 2 ms. At that deadline, unless a later
// renewal has been confirmed, the hold is lost: its Lost channel closes and
// the contexts returned by HoldContext are cancelled with a cause matching
// ErrLost. Nothing delays that: not a renewal still in flight, a partitioned
// or stalled connection, a slow telemetry exporter or log handler, and not
// go-redis's own timeouts, which dlock does not rely on. A hold is also lost
// when a renewal finds its key gone, and when the Client closes.
//
// Why the holder hears first: Redis starts a lease when it runs the request,
// which is after the request was sent, and expires the key a lease later on
// its own clock. So as long as the server's clock does not run more than 1%
// fast against this process's (a bound on drift, not on offset: the clocks
// need not agree on the time of day), the key outlives the deadline, and no
// one else can be granted the lock before the holder's Lost fires. The
// margin, at least 2 ms plus 1% of the lease, is the holder's time to stop.
//
// A grant that arrives with less than a third of its lease left (a cold
// connection over a slow network, a stalled server) is not returned as a
// hold: Lock gives it back and tries again, TryLock gives it back and
// reports ErrNotObtained. An Unlock that fails stops the renewals of its
// hold, which then ends by its lease at the latest.
//
// What the deadline cannot cover: a holder that is paused (a long GC, a
// suspended process, a stalled VM) cannot act on Lost while paused, and may
// act on its lock after waking. Only a fencing token checked by the
// protected resource closes that gap. And Redis must keep the key: a
// failover that loses recent writes, or eviction under maxmemory, ends a
// hold on the server without any deadline passing.
//
// # Observability
//
// Every acquire and release call records an OpenTelemetry span, a child of
// the span in its context, with the lock's kind, name and lease mode, its
// result, the holder it found the lock held by, and an event for each
// wake-up with its reason. A lost hold records a span linked to the one
// that acquired it. Metrics cover wait and hold durations, acquisitions and
// releases by result, losses, renewals, and current waiters and holds. The
// global providers are used unless WithTracerProvider or WithMeterProvider
// say otherwise; dlock depends on the OpenTelemetry API only.
//
// # Guarantees and limits
//
// dlock's locks are leases. A holder that stops running for longer than its
// lease (a long GC pause, a stopped VM, a process suspended by a debugger)
// may find on waking that the lease expired and someone else holds the lock.
// The Lost signal narrows that window but cannot close it, because the
// holder cannot act while it is paused. Only a fencing token that the
// protected resource itself checks can close it: every acquisition returns
// one, strictly increasing per name, and package fence checks it at the
// resource.
//
// Redis replication is asynchronous. If the primary fails over before a lock
// write reaches a replica, the new primary does not have the lock, and a
// second holder can get it. dlock runs on one Redis, Redis Cluster (all keys
// of a lock share one hash slot) or Sentinel, and promises no more than
// they keep. Two options go further: WithSyncReplicas makes every grant wait
// until replicas acknowledge it (Redis's WAIT), so that a failover to one of
// them keeps the lock; NewRedlock runs a Mutex over an odd number of
// independent masters with the Redlock algorithm, which survives the loss
// of a minority of them (see Redlock for what that rests on). dlock runs no
// quorum protocol of its own invention.
//
// Close stops renewals without releasing: held locks expire by their lease.
package dlock
