// Package wait is how blocked callers wait without polling: a Client's
// Registry of local waiters, FIFO per lock channel (registry.go), the Loop
// a blocking call runs (wait.go: join, subscribe, sleep until a wake-up or
// the holder's lease, try again), and the cohort queue of a Mutex's local
// handoffs (cohort.go).
//
// It calls lease, pubsub, telemetry, wire and errs. Its Registry's lock is
// taken before the watchdog's (a cohort's pick runs under it, and passes a
// hold on in the watchdog) and never under it; wake-ups are sent on
// buffered channels, so no wake-up blocks under the lock.
package wait
