package redisson

import (
	"embed"

	"github.com/redis/go-redis/v9"
)

// The Lua files hold this package's own scripts, written from the protocol
// in docs/redisson.md; each opens with its KEYS, ARGV and replies.
//
//go:embed lua/*.lua
var luaFiles embed.FS

var (
	scriptLockTry    = load("lock_try.lua")
	scriptLockUnlock = load("lock_unlock.lua")
	scriptLockForce  = load("lock_force.lua")
	scriptLockRenew  = load("lock_renew.lua")
	scriptLockExtend = load("lock_extend.lua")

	scriptRWTryRead     = load("rw_try_read.lua")
	scriptRWTryWrite    = load("rw_try_write.lua")
	scriptRWUnlockRead  = load("rw_unlock_read.lua")
	scriptRWUnlockWrite = load("rw_unlock_write.lua")
	scriptRWRenewRead   = load("rw_renew_read.lua")
	scriptRWForce       = load("rw_force.lua")

	scriptSemTry     = load("sem_try.lua")
	scriptSemRelease = load("sem_release.lua")
	scriptSemSet     = load("sem_set.lua")

	scriptLatchSet  = load("latch_set.lua")
	scriptLatchDown = load("latch_down.lua")
)

func load(name string) *redis.Script {
	b, err := luaFiles.ReadFile("lua/" + name)
	if err != nil {
		panic("redisson: missing script " + name)
	}
	return redis.NewScript(string(b))
}
