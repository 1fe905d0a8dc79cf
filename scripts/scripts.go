// Package scripts embeds dlock's Lua scripts. Every state change dlock makes
// in Redis is one of these scripts. Each .lua file opens with its contract:
// KEYS, ARGV and return values.
//
// The scripts are wrapped once in redis.NewScript and always run with Run (or
// EvalSha with an Eval fallback), so Redis caches them by SHA1 and a SCRIPT
// FLUSH or restart costs one extra round trip, never an error.
package scripts

import (
	_ "embed"
	"strings"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed mutex_common.lua
	mutexCommon string
	//go:embed mutex_cancel.lua
	mutexCancel string
	//go:embed mutex_try.lua
	mutexTry string
	//go:embed mutex_unlock.lua
	mutexUnlock string
	//go:embed reentrant_try.lua
	reentrantTry string
	//go:embed reentrant_unlock.lua
	reentrantUnlock string
	//go:embed force_unlock.lua
	forceUnlock string
	//go:embed renew.lua
	renew string
	//go:embed rw_common.lua
	rwCommon string
	//go:embed rw_try_read.lua
	rwTryRead string
	//go:embed rw_try_write.lua
	rwTryWrite string
	//go:embed rw_unlock_read.lua
	rwUnlockRead string
	//go:embed rw_unlock_write.lua
	rwUnlockWrite string
	//go:embed rw_cancel_write.lua
	rwCancelWrite string
	//go:embed sem_common.lua
	semCommon string
	//go:embed sem_try.lua
	semTry string
	//go:embed sem_release.lua
	semRelease string
	//go:embed sem_cancel.lua
	semCancel string
	//go:embed sem_permits.lua
	semPermits string
	//go:embed sem_available.lua
	semAvailable string
	//go:embed latch_count_down.lua
	latchCountDown string
	//go:embed latch_set.lua
	latchSet string
)

// The scripts, ready to Run. See each .lua file for its contract.
var (
	// The Mutex scripts include mutex_common.lua where they say so.
	MutexTry    = redis.NewScript(include(mutexTry, "mutex_common.lua", mutexCommon))
	MutexUnlock = redis.NewScript(include(mutexUnlock, "mutex_common.lua", mutexCommon))
	MutexCancel = redis.NewScript(include(mutexCancel, "mutex_common.lua", mutexCommon))

	ReentrantTry    = redis.NewScript(reentrantTry)
	ReentrantUnlock = redis.NewScript(reentrantUnlock)
	ForceUnlock     = redis.NewScript(forceUnlock)
	Renew           = redis.NewScript(renew)

	// The RWMutex scripts share rw_common.lua, prepended to each.
	RWTryRead     = redis.NewScript(rwCommon + rwTryRead)
	RWTryWrite    = redis.NewScript(rwCommon + rwTryWrite)
	RWUnlockRead  = redis.NewScript(rwCommon + rwUnlockRead)
	RWUnlockWrite = redis.NewScript(rwCommon + rwUnlockWrite)
	RWCancelWrite = redis.NewScript(rwCommon + rwCancelWrite)

	// The Semaphore scripts share sem_common.lua, prepended to each.
	SemTry       = redis.NewScript(semCommon + semTry)
	SemRelease   = redis.NewScript(semCommon + semRelease)
	SemCancel    = redis.NewScript(semCommon + semCancel)
	SemPermits   = redis.NewScript(semCommon + semPermits)
	SemAvailable = redis.NewScript(semCommon + semAvailable)

	LatchSet       = redis.NewScript(latchSet)
	LatchCountDown = redis.NewScript(latchCountDown)
)

// include replaces the line "--#include <name>" in script with body. A
// script without that line is a bug, caught when the package loads.
func include(script, name, body string) string {
	line := "--#include " + name + "\n"
	if strings.Count(script, line) != 1 {
		panic("scripts: " + name + " must be included exactly once")
	}
	return strings.Replace(script, line, body, 1)
}
