package redisson

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/dlock-go/dlock/internal/wire"
)

func TestNames_FollowRedissonsBraceRule(t *testing.T) {
	for _, tc := range []struct {
		name, lock, token, rw, sem, latch, hold string
	}{
		{"orders", "redisson_lock__channel:{orders}", "redisson_lock_token:{orders}", "redisson_rwlock:{orders}",
			"redisson_sc:{orders}", "redisson_countdownlatch__channel__{orders}", "{orders}:u:7:rwlock_timeout"},
		{"job{42}", "redisson_lock__channel:job{42}", "redisson_lock_token:job{42}", "redisson_rwlock:job{42}",
			"redisson_sc:job{42}", "redisson_countdownlatch__channel__{job{42}}", "job{42}:u:7:rwlock_timeout"},
	} {
		assert.Equal(t, tc.lock, lockChannel(tc.name))
		assert.Equal(t, tc.token, tokenKey(tc.name))
		assert.Equal(t, tc.rw, rwChannel(tc.name))
		assert.Equal(t, tc.sem, semaphoreChannel(tc.name))
		assert.Equal(t, tc.latch, latchChannel(tc.name))
		assert.Equal(t, tc.hold, rwTimeoutPrefix(tc.name, "u:7"))
		// Every lock key shares the name's slot.
		for _, k := range []string{tc.lock, tc.token, tc.rw, tc.sem, tc.hold + ":1"} {
			assert.Equal(t, wire.Slot(tc.name), wire.Slot(k), k)
		}
	}
}

func TestThreadID_KeepsDecimalsAndHashesTheRest(t *testing.T) {
	assert.Equal(t, "87", threadID("87"))
	assert.Equal(t, "0", threadID("0"))
	for _, o := range []string{"-1", "007", "9223372036854775808", "a", "a:write", "ÿ"} {
		id := threadID(o)
		assert.Regexp(t, `^[0-9]+$`, id, o)
		assert.NotEqual(t, o, id)
		assert.Equal(t, id, threadID(o), "stable")
	}
	assert.NotEqual(t, threadID("a"), threadID("b"))
}
