// Package wire owns every format dlock writes to Redis or reads from it, on
// the Go side: the IDs of Clients, holds and waiters; the keys and channels
// of a primitive; the release messages scripts publish; the waiter names
// queued in Redis; the lease specs the renewal script checks; and the
// replies of the acquiring scripts. internal/scripts/lib.lua is the Lua side
// of the same formats, and wire's tests check the two against each other.
// No other package builds or parses these strings; the replies of the
// inspecting and releasing scripts (state, excl_state, the release
// scripts) are read by the one caller of each. It imports errs only.
package wire
