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
//     by goroutines; each acquisition has a fresh random token. Blocked
//     callers queue in Redis and are handed the lock in arrival order.
//   - ReentrantMutex: a lock that counts holds per owner, so nested business
//     logic that passes its context along (see WithOwner) re-enters.
//   - RWMutex: many readers or one writer, reentrant per owner, preferring
//     writers; each reader has its own lease.
//   - Semaphore: counting permits that are leases, served in arrival order.
//   - CountDownLatch: wait until a shared count reaches zero.
//
// # How it works
//
// Every state change is one Lua script (see the scripts directory, where each
// file states its KEYS, ARGV and return values), run by EVALSHA with an EVAL
// fallback. An uncontended Lock and Unlock cost one round trip each, and
// calls that goroutines of one Client make at the same moment share
// pipelines.
//
// A blocked Lock does not poll. It waits on the Client's single pub/sub
// connection, with a timer at the holder's remaining lease as the fallback.
// A blocked Mutex Lock also joins the lock's queue in Redis; Unlock hands the
// lock to the first live waiter there and tells it so, and that waiter
// returns holding the lock without another round trip. For the other
// primitives a release message says whom to wake, and they try again. A
// waiter subscribes before its last try, and a re-subscription after a
// dropped connection makes every waiter look again, so neither a lost
// message nor a killed connection strands a waiter.
//
// A hold taken without WithLease gets the watchdog timeout as its lease
// (WithWatchdogTimeout, default 30s). One goroutine per Client renews all
// such holds every third of that, up to 100 keys per script call and all
// calls of a period in one pipeline. An explicit WithLease hold is never
// renewed.
//
// # Lost holds
//
// A hold is lost when a renewal finds its key gone, when renewals fail for a
// whole lease (measured on the monotonic clock from the last renewal that
// succeeded), when a WithLease lease runs out, or when the Client closes.
// The holder learns it from the handle's Lost channel, and from the context
// returned by HoldContext, which is cancelled with a cause matching ErrLost.
// Loss is also logged (WithLogger). Unlock of a lost hold returns ErrLost.
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
// protected resource itself checks can close it; fencing tokens are planned.
//
// Redis replication is asynchronous. If the primary fails over before a lock
// write reaches a replica, the new primary does not have the lock, and a
// second holder can get it. dlock runs on one Redis, Redis Cluster (all keys
// of a lock share one hash slot) or Sentinel, and promises no more than
// they keep. It does not implement a multi-master quorum of its own.
//
// Close stops renewals without releasing: held locks expire by their lease.
package dlock
