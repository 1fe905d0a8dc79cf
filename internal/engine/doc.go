// Package engine is dlock's machinery on one Redis (a server, its
// Sentinel deployment or a cluster), below the public API of package
// dlock: a Client's Core (its connection, watchdog, pub/sub hub, registry
// of waiters, counted holds and telemetry), the Handle every primitive
// shares, the acquisition lifecycle (acquire.go), the release lifecycle
// (release.go), Extend (extend.go), the exclusive lock of excl_*.lua
// (excl.go), counted holds (counted.go, holds.go), replica acknowledgement
// (syncreplicas.go), and the Mutex engine with lock cohorting (mutex.go,
// cohort.go).
//
// # The engine seam
//
// A public Mutex runs on a Lock (lock.go), chosen when the Mutex is made:
// this package's Mutex, or internal/redlock's. The Mutex keeps what every
// engine shares: its Handle (name, kind, lease terms, span and error
// helpers) and its Slot (its current hold, a lease.Hold the Core's
// watchdog keeps). An engine on another store implements Lock, and gives
// the Core a lease.Sender that renews its holds' leases in batches (see
// NewDetached): the public Mutex, its spans, its errors, Lost and
// HoldContext, the lease clock and the local wait registry then work as
// they are.
//
// # What it may call
//
// Package engine calls lease, wait, pubsub, coalesce, telemetry, wire,
// errs and scripts; never package dlock, which calls it. internal/redlock
// calls it.
//
// # Lock order
//
// An owner's gate (Core.gate), then the hold table's lock, then the
// watchdog's (trackHold asks the watchdog under the table's lock). The
// wait registry's lock, then the watchdog's and a Slot's (a cohort's
// local handoff, PickCohort's pick, runs under the registry's lock and
// passes the hold on in the watchdog and the waiter's Slot). A Slot's lock
// is a leaf: a hold it replaces is reported lost after it is released. No
// lock is held across a round trip to Redis.
package engine
