// Package scripts embeds dlock's Lua scripts. Every state change dlock makes
// in Redis is one of these scripts. Each .lua file opens with its contract:
// KEYS, ARGV and return values.
//
// The scripts are wrapped once in redis.NewScript and always run with Run (or
// EvalSha with an Eval fallback), so Redis caches them by SHA1 and a SCRIPT
// FLUSH or restart costs one extra round trip, never an error.
//
// # Shared helpers
//
// Helpers live once: lib.lua (the server's clock, expired-member cleanup,
// expiry lengthening, and the release-message format that internal/wire owns
// on the Go side), and one *_common.lua per data model (the Mutex queue, the
// RWMutex, the Semaphore) stating that model and its own helpers, and the
// lock cohorts' two shared by the exclusive locks and the RWMutex
// (queue_hint.lua for the tries, cohort_end.lua for the releases). A script
// takes them with a line '--#include <file>', which is replaced by the file,
// itself resolved the same way; a file is included at most once per script.
//
// Where the line stands matters. Redis runs the whole script on every call,
// and defining Lua functions costs about a microsecond per call, a seventh
// of a small script's cost. Most scripts include their helpers at the top.
// The exclusive lock's try and unlock, whose uncontended case is the hot
// path, handle that case first with a few lines of their own and include
// their helpers after it has returned, so that it pays for nothing it does
// not use; the exclusive lock's and the RWMutex writer's unlock do the same
// for a handoff to a live first waiter.
//
// # Script flags
//
// A script may open with a shebang line that sets Redis 7 script flags
// ('#!lua flags=...'). Redis reads it only as the script's very first line,
// so the line stays first: includes resolve after it, and an included file
// must have none (loading the package panics otherwise).
package scripts

import (
	"embed"
	"strings"

	"github.com/redis/go-redis/v9"
)

//go:embed *.lua
var files embed.FS

// The scripts, ready to Run. See each .lua file for its contract.
var (
	ExclTry    = load("excl_try.lua")
	ExclUnlock = load("excl_unlock.lua")
	ExclCancel = load("excl_cancel.lua")
	ExclForce  = load("excl_force.lua")
	ExclState  = load("excl_state.lua")

	Renew     = load("renew.lua")
	RenewNode = load("renew_node.lua")

	RWTryRead     = load("rw_try_read.lua")
	RWTryWrite    = load("rw_try_write.lua")
	RWUnlockRead  = load("rw_unlock_read.lua")
	RWUnlockWrite = load("rw_unlock_write.lua")
	RWCancel      = load("rw_cancel.lua")
	RWState       = load("rw_state.lua")
	RWForce       = load("rw_force.lua")

	SemTry       = load("sem_try.lua")
	SemRelease   = load("sem_release.lua")
	SemCancel    = load("sem_cancel.lua")
	SemPermits   = load("sem_permits.lua")
	SemAvailable = load("sem_available.lua")
	SemDrain     = load("sem_drain.lua")
	SemDelete    = load("sem_delete.lua")
	SemPass      = load("sem_pass.lua")

	LatchSet       = load("latch_set.lua")
	LatchCountDown = load("latch_count_down.lua")
	LatchState     = load("latch_state.lua")
	LatchDelete    = load("latch_delete.lua")

	ElectionProclaim = load("election_proclaim.lua")
	ElectionLeader   = load("election_leader.lua")

	State = load("state.lua")

	Redlock = load("redlock.lua")
)

func load(name string) *redis.Script {
	return redis.NewScript(Source(name))
}

// Source returns the script in file name with its includes resolved. A
// missing file is a bug, caught when the package loads.
func Source(name string) string {
	return resolve(name, map[string]bool{})
}

const includeMark = "--#include "

func resolve(name string, seen map[string]bool) string {
	body, err := files.ReadFile(name)
	if err != nil {
		panic("scripts: " + err.Error())
	}
	top := len(seen) == 0
	seen[name] = true
	var out strings.Builder
	first := true
	for line := range strings.Lines(string(body)) {
		if strings.HasPrefix(line, "#!") && !(top && first) {
			panic("scripts: " + name + ": a shebang line must be the script's first line")
		}
		first = false
		inc, ok := strings.CutPrefix(strings.TrimRight(line, "\n"), includeMark)
		switch {
		case !ok:
			out.WriteString(line)
		case !seen[inc]:
			out.WriteString(resolve(inc, seen))
		}
	}
	return out.String()
}
