// Package lease keeps the leases of a Client's holds and waiting marks:
// the record of a hold (Hold, Lease, Mark), the watchdog that renews them
// and ends each at its deadline on the monotonic clock (watchdog.go,
// clock.go, renewer.go), Extend, hand-over and cohort passes of a lease
// (extend.go, handover.go, pass.go), and how renewals reach Redis, on one
// server or a cluster (renewals.go, renew_cluster.go).
//
// It calls telemetry, wire, errs and scripts, and sends renewals through
// a Sender its caller gives (Renewals.Send for one Redis, a Redlock's own
// for its masters). Nothing of it calls back into the caller under the
// watchdog's lock: ends are reported, and marks' owners woken, after it is
// released. The watchdog's lock is taken under the wait registry's and a
// Core's hold table's (see internal/engine), never the other way round.
// A hold's Contexts lock is a leaf, taken under the watchdog's.
package lease
