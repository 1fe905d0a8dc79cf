package fence_test

import (
	"context"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dlock-go/dlock/fence"
	"github.com/dlock-go/dlock/internal/redistest"
)

// newRedis returns a guard on a dedicated real redis-server, and a client of
// that server for looking at what the guard wrote.
func newRedis(t *testing.T) (*fence.Redis, *redis.Client) {
	t.Helper()
	rdb := redistest.Real(t).NewClient(t)
	return fence.NewRedis(rdb), rdb
}

func TestRedis_Set_AdmitsEqualAndHigherTokens_RefusesLower(t *testing.T) {
	ctx := context.Background()
	g, rdb := newRedis(t)

	for i, v := range []string{"a", "b", "c"} {
		require.NoError(t, g.Set(ctx, "doc", 5, v, 0), "write %d with the same token", i)
		assert.Equal(t, v, rdb.Get(ctx, "doc").Val())
	}
	requireStale(t, g.Set(ctx, "doc", 4, "stale", 0), 4, 5)
	assert.Equal(t, "c", rdb.Get(ctx, "doc").Val(), "a stale write changed the value")

	require.NoError(t, g.Set(ctx, "doc", 9, "d", 0))
	requireStale(t, g.Set(ctx, "doc", 8, "stale", 0), 8, 9)
	assert.Equal(t, "d", rdb.Get(ctx, "doc").Val())

	record, err := g.RecordKey("doc")
	require.NoError(t, err)
	assert.Equal(t, "fence:{doc}doc", record)
	assert.Equal(t, "9", rdb.Get(ctx, record).Val(), "record")
	assert.Equal(t, time.Duration(-1), rdb.TTL(ctx, record).Val(), "the record must not expire")
}

func TestRedis_StaleError_NamesKeyAndBothTokens(t *testing.T) {
	ctx := context.Background()
	g, _ := newRedis(t)
	require.NoError(t, g.Set(ctx, "orders:42", 34, "v", 0))
	err := g.Set(ctx, "orders:42", 33, "v", 0)
	assert.EqualError(t, err, `fence: stale token: "orders:42": token 33 < admitted 34`)
}

// Tokens past 2^53 lose precision as Lua numbers (2^60 and 2^60+1 are the
// same double), and as strings "10" < "9": both comparisons would be wrong.
func TestRedis_Set_ComparesTokensExactly(t *testing.T) {
	ctx := context.Background()
	g, _ := newRedis(t)
	for _, c := range []struct{ high, low uint64 }{
		{10, 9},
		{1<<60 + 1, 1 << 60},
		{math.MaxUint64, math.MaxUint64 - 1},
	} {
		key := "k" + strconv.FormatUint(c.low, 10)
		require.NoError(t, g.Set(ctx, key, c.low, "low", 0))
		require.NoError(t, g.Set(ctx, key, c.high, "high", 0), "%d after %d", c.high, c.low)
		requireStale(t, g.Set(ctx, key, c.low, "low", 0), c.low, c.high)
		require.NoError(t, g.Set(ctx, key, c.high, "high", 0), "%d again", c.high)
	}
}

func TestRedis_Set_TTL(t *testing.T) {
	ctx := context.Background()
	g, rdb := newRedis(t)
	require.NoError(t, g.Set(ctx, "k", 1, "v", 10*time.Second))
	pttl := rdb.PTTL(ctx, "k").Val()
	assert.True(t, pttl > 9*time.Second && pttl <= 10*time.Second, "PTTL %v, want about 10s", pttl)
	require.NoError(t, g.Set(ctx, "k", 1, "v", 0))
	assert.Equal(t, time.Duration(-1), rdb.PTTL(ctx, "k").Val(), "ttl 0 must remove the expiry, as SET does")
	require.NoError(t, g.Set(ctx, "k", 1, "v", time.Microsecond))
	assert.Eventually(t, func() bool { return rdb.Exists(ctx, "k").Val() == 0 }, time.Second, 5*time.Millisecond,
		"a sub-millisecond ttl must expire the key")
}

func TestRedis_Del_KeepsTheRecord_SoAStaleWriterCannotRecreateTheKey(t *testing.T) {
	ctx := context.Background()
	g, rdb := newRedis(t)
	require.NoError(t, g.Set(ctx, "k", 3, "v", 0))
	requireStale(t, g.Del(ctx, "k", 2), 2, 3)
	assert.Equal(t, int64(1), rdb.Exists(ctx, "k").Val(), "a stale Del deleted the key")
	require.NoError(t, g.Del(ctx, "k", 4))
	assert.Equal(t, int64(0), rdb.Exists(ctx, "k").Val())
	requireStale(t, g.Set(ctx, "k", 3, "back", 0), 3, 4)
	assert.Equal(t, int64(0), rdb.Exists(ctx, "k").Val(), "a stale writer recreated a deleted key")
	require.NoError(t, g.Del(ctx, "k", 4), "deleting a missing key is no error")
}

func TestRedis_HSet_AdmitsAndRefuses(t *testing.T) {
	ctx := context.Background()
	g, rdb := newRedis(t)
	require.NoError(t, g.HSet(ctx, "h", 2, "a", 1, "b", []byte("x")))
	require.NoError(t, g.HSet(ctx, "h", 2, "a", 2))
	requireStale(t, g.HSet(ctx, "h", 1, "a", 9), 1, 2)
	assert.Equal(t, map[string]string{"a": "2", "b": "x"}, rdb.HGetAll(ctx, "h").Val())
	assert.ErrorIs(t, g.HSet(ctx, "h", 3, "a"), fence.ErrInvalid, "odd arguments")
	assert.ErrorIs(t, g.HSet(ctx, "h", 3), fence.ErrInvalid, "no arguments")
}

// A write that fails in Redis must leave the record as it was: otherwise a
// failed write would still lock out the writers below it.
func TestRedis_FailedWrite_LeavesRecordUnraised(t *testing.T) {
	ctx := context.Background()
	g, rdb := newRedis(t)
	require.NoError(t, g.Set(ctx, "s", 7, "string", 0))
	err := g.HSet(ctx, "s", 9, "f", "v")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "WRONGTYPE")
	assert.NotErrorIs(t, err, fence.ErrStale)
	record, _ := g.RecordKey("s")
	assert.Equal(t, "7", rdb.Get(ctx, record).Val())
	require.NoError(t, g.Set(ctx, "s", 8, "string", 0), "token 8 refused after token 9's write failed")
}

func TestRedis_InvalidInput_WritesNothing(t *testing.T) {
	ctx := context.Background()
	g, rdb := newRedis(t)
	assert.ErrorIs(t, g.Set(ctx, "k", 0, "v", 0), fence.ErrInvalid, "token 0")
	assert.ErrorIs(t, g.Del(ctx, "k", 0), fence.ErrInvalid, "token 0")
	assert.ErrorIs(t, g.Set(ctx, "", 1, "v", 0), fence.ErrInvalid, "empty key")
	assert.ErrorIs(t, g.Set(ctx, "a}b", 1, "v", 0), fence.ErrInvalid, "no hash tag, and a '}'")
	assert.ErrorIs(t, g.Set(ctx, "x{}y", 1, "v", 0), fence.ErrInvalid, "an empty hash tag, and a '}'")
	assert.ErrorIs(t, g.Set(ctx, "k", 1, "v", -time.Second), fence.ErrInvalid, "negative ttl")
	assert.Zero(t, rdb.DBSize(ctx).Val(), "keys written: %v", rdb.Keys(ctx, "*").Val())

	for name, bad := range map[string]*fence.Redis{
		"nil client":       fence.NewRedis(nil),
		"typed nil client": fence.NewRedis((*redis.Client)(nil)),
		"brace in prefix":  fence.NewRedis(rdb, fence.WithRecordPrefix("f{")),
	} {
		assert.ErrorIs(t, bad.Set(ctx, "k", 1, "v", 0), fence.ErrInvalid, name)
	}
	assert.Zero(t, rdb.DBSize(ctx).Val())
}

func TestRedis_WithRecordPrefix(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Real(t).NewClient(t)
	g := fence.NewRedis(rdb, fence.WithRecordPrefix("app:fence:"))
	require.NoError(t, g.Set(ctx, "{u:1}:name", 3, "v", 0))
	assert.Equal(t, "3", rdb.Get(ctx, "app:fence:{u:1}{u:1}:name").Val())
}

// Every data key gets a record of its own: "X" and "{X}", or "{X}" and
// "{X}X", must not share one, or tokens of one would refuse writes to the
// other.
func TestRedis_RecordKey_DistinctForDistinctKeys(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{})
	defer rdb.Close()
	g := fence.NewRedis(rdb)
	keys := []string{"X", "{X}", "{X}X", "X{X}", "{X}{X}", "a{b", "a{b}", "{a{b}", "{", "x{}", "fence:X", "{X}}"}
	seen := map[string]string{}
	for _, k := range keys {
		r, err := g.RecordKey(k)
		if k == "x{}" {
			require.ErrorIs(t, err, fence.ErrInvalid, k)
			continue
		}
		require.NoError(t, err, k)
		if other, dup := seen[r]; dup {
			t.Fatalf("keys %q and %q share record %q", other, k, r)
		}
		seen[r] = k
	}
}

func TestRedis_ConcurrentWriters_FinalValueIsTheHighestToken(t *testing.T) {
	ctx := context.Background()
	g, rdb := newRedis(t)
	highest := race(t, 16, 40, func(token uint64) error {
		return g.Set(ctx, "contended", token, token, 0)
	})
	assert.Equal(t, strconv.FormatUint(highest, 10), rdb.Get(ctx, "contended").Val())
	record, _ := g.RecordKey("contended")
	assert.Equal(t, strconv.FormatUint(highest, 10), rdb.Get(ctx, record).Val())
}

// On a cluster each write is one script call on the data key's node, which
// works only if the record shares the key's slot: true for keys with a hash
// tag, without one, and with a '{' but no tag.
func TestRedis_Cluster_KeysWithAndWithoutHashTags(t *testing.T) {
	ctx := context.Background()
	addrs := redistest.Cluster(t, 3)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = rdb.Close() })
	g := fence.NewRedis(rdb)

	keys := []string{"{user:7}:cart", "{user:7}:profile", "a{b}c", "half{open", "{X}", "X"}
	for i := range 30 {
		keys = append(keys, "orders:"+strconv.Itoa(i))
	}
	nodes := map[string]bool{}
	for _, key := range keys {
		record, err := g.RecordKey(key)
		require.NoError(t, err, key)
		require.Equal(t, rdb.ClusterKeySlot(ctx, key).Val(), rdb.ClusterKeySlot(ctx, record).Val(),
			"key %q and record %q in different slots", key, record)

		require.NoError(t, g.Set(ctx, key, 5, "five", 0), key)
		require.NoError(t, g.Set(ctx, key, 6, "six", 0), key)
		requireStale(t, g.Set(ctx, key, 5, "stale", 0), 5, 6)
		require.NoError(t, g.Set(ctx, key, 6, "six again", 0), key)
		requireStale(t, g.Del(ctx, key, 4), 4, 6)
		assert.Equal(t, "six again", rdb.Get(ctx, key).Val(), key)

		master, err := rdb.MasterForKey(ctx, key)
		require.NoError(t, err)
		nodes[master.Options().Addr] = true
	}
	require.NoError(t, g.HSet(ctx, "{user:7}:h", 2, "f", "v"))
	requireStale(t, g.HSet(ctx, "{user:7}:h", 1, "f", "w"), 1, 2)
	assert.Equal(t, "v", rdb.HGet(ctx, "{user:7}:h", "f").Val())
	assert.Len(t, nodes, 3, "the keys should spread over all three masters")

	highest := race(t, 8, 30, func(token uint64) error {
		return g.Set(ctx, "{user:7}:contended", token, token, 0)
	})
	assert.Equal(t, strconv.FormatUint(highest, 10), rdb.Get(ctx, "{user:7}:contended").Val())
}
