// Package redisson speaks the wire protocol of Redisson, the Java Redis
// client, for its locks and synchronizers, so that Go and Java processes
// share them: they exclude each other, wake each other through Redisson's
// pub/sub messages, and honour and renew each other's leases.
//
// A Client plays the part of one RedissonClient: it has a client id (a
// random UUID), and holder fields are <client id>:<thread id>, the thread
// id derived from the owner that dlock.WithOwner or dlock.WithNewOwner put
// in the context. Its handles are
//
//   - Lock, Redisson's RLock (getLock): reentrant, exclusive;
//   - FencedLock, RFencedLock: an RLock with a token counter shared with Java;
//   - ReadWriteLock, RReadWriteLock;
//   - Semaphore, RSemaphore;
//   - CountDownLatch, RCountDownLatch.
//
// Keys are the raw names, as Redisson uses them: no prefix is added. Holds
// taken without WithLease last the watchdog timeout (30 s, Redisson's
// lockWatchdogTimeout) and are renewed every third of it, batched per
// cluster slot, until Unlock; holds with a lease end by it. Lost and
// HoldContext report a hold that ended without Unlock.
//
// On a Redis Cluster the Client uses sharded pub/sub the way Redisson does
// by default (see ShardedMode). Match the Java side's configuration, or the
// two still exclude each other but no longer wake each other.
//
// docs/redisson.md in the repository states the protocol, the Redisson
// version it was read from (4.7.0), what the Go side does differently, and
// what the protocol cannot give: no FIFO queue, no fencing for RLock,
// wake-ups that pub/sub may lose.
package redisson
