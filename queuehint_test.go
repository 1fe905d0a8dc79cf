package dlock_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock/internal/scripts"
)

// The hot paths of excl_try and excl_unlock skip the queue when the lock's
// key has no queue hint (excl_common.lua). A key that comes back while
// others are still queued (it expired under them) must come back with the
// hint, whatever queues or not afterwards: here the first waiter takes the
// lock, nobody tries again, and its release must go to the second waiter.
func TestScripts_QueueHint_KeyBackWithWaitersQueued_ReleaseHandsOn(t *testing.T) {
	e := sharedEnv(t)
	rdb := e.rdb()
	ctx := ctxTimeout(t, 10*time.Second)
	keys := queueKeys(name(t))
	k := keys[0]
	const client = "hintclient"
	w1, w2 := "0:"+client+".1", "0:"+client+".2"
	now, err := rdb.Time(ctx).Result()
	require.NoError(t, err)
	// Both queued, with marks alive for a minute; the lock's key is gone.
	require.NoError(t, rdb.ZAdd(ctx, keys[1], redis.Z{Score: 1, Member: w1}, redis.Z{Score: 2, Member: w2}).Err())
	mark := float64(now.UnixMilli() + 60000)
	require.NoError(t, rdb.ZAdd(ctx, keys[2], redis.Z{Score: mark, Member: w1}, redis.Z{Score: mark, Member: w2}).Err())

	res, err := scripts.ExclTry.Run(ctx, rdb, keys, "mutex", w1, 30000, 0, client, "0", client+".1", 0).Slice()
	require.NoError(t, err)
	require.EqualValues(t, 1, res[0], "the first waiter takes the free lock")

	res, err = scripts.ExclUnlock.Run(ctx, rdb, keys, "mutex", client+".1", client, "0").Slice()
	require.NoError(t, err)
	require.Len(t, res, 4, "the release hands the lock on: %v", res)
	assert.Equal(t, client+".2", res[1], "handed to the second waiter")
	holder, err := rdb.HGet(ctx, k, "o").Result()
	require.NoError(t, err)
	assert.Equal(t, client+".2", holder)
}
