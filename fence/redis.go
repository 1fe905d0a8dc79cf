package fence

import (
	"context"
	_ "embed"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultRecordPrefix starts the key of every fence record the Redis guard
// keeps.
const DefaultRecordPrefix = "fence:"

//go:embed fence_write.lua
var writeSource string

var writeScript = redis.NewScript(writeSource)

// Redis guards writes to Redis keys. For each data key written through it,
// it keeps a fence record, a small string key holding the highest token
// admitted for that key, and each write checks the token against the record,
// writes, and raises the record in one Lua script: one atomic step, and one
// round trip (two when the server does not yet have the script cached).
//
// The resource a Redis guard protects is the data key itself: tokens are
// compared per key.
//
// # Fence records
//
// The record of data key K is RecordKey(K): the prefix, then K's hash tag in
// braces, then K. The hash tag is the one K has ("{user:1}:cart" has
// "user:1", so its record is "fence:{user:1}{user:1}:cart"), or else the
// whole of K ("orders:42" gets "fence:{orders:42}orders:42"). Either way the
// record hashes to K's Redis Cluster slot, so the script may touch both. A
// key with no hash tag that contains '}' cannot be given such a record and
// is refused with ErrInvalid; give it a hash tag.
//
// Records never expire, and a Del keeps the record: a record that went away
// would let the very writer it exists to stop, one paused past its lease,
// write again, and no expiry time is safe without a bound on pauses, which is
// what fencing does without. So the guard keeps one record, a small string
// key whose name is about twice as long as the data key's, for every key
// ever written through it, including keys that have expired since. To
// retire a key for good, once no writer can still hold a token for it,
// delete the key and its record (they share a slot, so one DEL can take
// both).
//
// For the same reason Redis must not evict records: run it with a
// maxmemory-policy of noeviction or one of the volatile-* policies (records
// have no TTL, so those never evict them), not allkeys-*.
//
// Redis replication is asynchronous: a failover can lose an admitted write,
// and the record raised with it is lost too (one script run replicates as
// one transaction). The guard then behaves as if that write had never
// happened.
//
// A Redis guard is safe for concurrent use.
type Redis struct {
	rdb    redis.Scripter
	prefix string
	err    error // from NewRedis; every call returns it
}

// RedisOption configures a Redis guard. See NewRedis.
type RedisOption func(*redisConfig)

type redisConfig struct {
	prefix string
	err    error
}

// WithRecordPrefix sets the string every fence record's key starts with.
// Default DefaultRecordPrefix, "fence:". It must not contain '{' or '}',
// which the guard uses for the hash tag. Keys that start with the prefix
// are the guard's: write none of them through it.
func WithRecordPrefix(prefix string) RedisOption {
	return func(c *redisConfig) {
		if strings.ContainsAny(prefix, "{}") {
			c.err = invalidf("record prefix %q contains a brace", prefix)
			return
		}
		c.prefix = prefix
	}
}

// NewRedis returns a guard that writes through rdb: a *redis.Client, a
// *redis.ClusterClient, a failover client or a *redis.Ring, not a pipeline.
//
// NewRedis never fails. A nil rdb or an invalid option makes every later
// call return an error wrapping ErrInvalid, and nothing is sent to Redis.
func NewRedis(rdb redis.Scripter, opts ...RedisOption) *Redis {
	cfg := redisConfig{prefix: DefaultRecordPrefix}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	r := &Redis{rdb: rdb, prefix: cfg.prefix, err: cfg.err}
	if v := reflect.ValueOf(rdb); rdb == nil || v.Kind() == reflect.Pointer && v.IsNil() {
		r.err = invalidf("nil redis client")
	}
	return r
}

// RecordKey returns the key of the fence record that guards key. It fails
// with ErrInvalid for an empty key, or one that has no hash tag and contains
// '}'.
func (r *Redis) RecordKey(key string) (string, error) {
	if key == "" {
		return "", invalidf("empty key")
	}
	tag, ok := hashTag(key)
	if !ok {
		if strings.IndexByte(key, '}') >= 0 {
			return "", invalidf("key %q has no hash tag but contains '}', so no record key can share its slot: give it a hash tag", key)
		}
		tag = key
	}
	return r.prefix + "{" + tag + "}" + key, nil
}

// hashTag returns the part of key that Redis Cluster hashes when it is not
// the whole key: what lies between the first '{' and the first '}' after it,
// if that is not empty.
func hashTag(key string) (string, bool) {
	s := strings.IndexByte(key, '{')
	if s < 0 {
		return "", false
	}
	e := strings.IndexByte(key[s+1:], '}')
	if e <= 0 {
		return "", false
	}
	return key[s+1 : s+1+e], true
}

// Set sets key to value, as SET does, if token is at least the highest token
// admitted for key, and then records token as that highest. A ttl of 0 means
// no expiry (and, as with SET, removes any the key had); a positive ttl
// expires the key after it, rounded down to milliseconds (up to 1 ms if
// less); a negative ttl is ErrInvalid. The value is formatted as go-redis
// formats a command argument: strings, []byte, numbers, bool, time.Time,
// encoding.BinaryMarshaler.
//
// Set returns nil when the write is done, an error matching ErrStale (a
// *StaleError) when a higher token was admitted before and nothing was
// written, ErrInvalid for token 0 or a bad key, and otherwise the error from
// Redis or the network (then, as with any Redis command, the write may or
// may not have happened). It costs one round trip, two when the server lacks
// the script; ctx bounds it as it bounds any go-redis command.
func (r *Redis) Set(ctx context.Context, key string, token uint64, value any, ttl time.Duration) error {
	switch {
	case ttl < 0:
		return invalidf("negative ttl %v for %q", ttl, key)
	case ttl == 0:
		return r.write(ctx, key, token, "SET", value)
	}
	ms := ttl.Milliseconds()
	if ms == 0 {
		ms = 1
	}
	return r.write(ctx, key, token, "SET", value, "PX", ms)
}

// HSet sets fields of the hash at key, as HSET does, if token is at least
// the highest token admitted for key, and then records token as that
// highest. fieldsAndValues alternate field and value, each formatted as Set
// formats its value; one call takes up to a few thousand pairs (the script
// passes them on with Lua's unpack, which stops at about 8,000 values).
// Errors, atomicity and round trips are those of Set; an odd or empty
// fieldsAndValues is ErrInvalid, and a key that holds another type fails
// with Redis's WRONGTYPE error, with nothing changed.
func (r *Redis) HSet(ctx context.Context, key string, token uint64, fieldsAndValues ...any) error {
	if len(fieldsAndValues) == 0 || len(fieldsAndValues)%2 != 0 {
		return invalidf("HSet of %q needs field-value pairs, got %d arguments", key, len(fieldsAndValues))
	}
	return r.write(ctx, key, token, "HSET", fieldsAndValues...)
}

// Del deletes key, as DEL does, if token is at least the highest token
// admitted for key, and then records token as that highest. The record
// stays, so a stale writer cannot bring the key back. Errors, atomicity and
// round trips are those of Set; deleting a key that does not exist is no
// error.
func (r *Redis) Del(ctx context.Context, key string, token uint64) error {
	return r.write(ctx, key, token, "DEL")
}

func (r *Redis) write(ctx context.Context, key string, token uint64, cmd string, args ...any) error {
	if r.err != nil {
		return r.err
	}
	if err := checkArgs(key, token); err != nil {
		return err
	}
	record, err := r.RecordKey(key)
	if err != nil {
		return err
	}
	res, err := writeScript.Run(ctx, r.rdb, []string{record, key},
		append([]any{strconv.FormatUint(token, 10), cmd}, args...)...).Slice()
	if err != nil {
		return fmt.Errorf("fence: %s %q: %w", cmd, key, err)
	}
	if len(res) == 1 && res[0] == int64(1) {
		return nil
	}
	if len(res) == 2 {
		s, _ := res[1].(string)
		if admitted, err := strconv.ParseUint(s, 10, 64); err == nil && admitted > token {
			return &StaleError{Resource: key, Token: token, Admitted: admitted}
		}
	}
	return fmt.Errorf("fence: %s %q: unexpected reply %v: record %s holds no token", cmd, key, res, record)
}
