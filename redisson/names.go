package redisson

import (
	"hash/fnv"
	"strconv"
	"strings"
)

// prefixName is Redisson's RedissonObject.prefixName: prefix:name when name
// contains '{' anywhere, else prefix:{name}. So every derived key and
// channel of a name hashes to the name's cluster slot (docs/redisson.md
// §2.1), except for names with a '{' that opens no valid hash tag, a
// Redisson defect kept on purpose.
func prefixName(prefix, name string) string {
	if strings.Contains(name, "{") {
		return prefix + ":" + name
	}
	return prefix + ":{" + name + "}"
}

// suffixName is Redisson's RedissonObject.suffixName: name:suffix when name
// contains '{', else {name}:suffix.
func suffixName(name, suffix string) string {
	if strings.Contains(name, "{") {
		return name + ":" + suffix
	}
	return "{" + name + "}:" + suffix
}

// keyPrefix is what suffixName puts before ':' + suffix.
func keyPrefix(name string) string {
	if strings.Contains(name, "{") {
		return name
	}
	return "{" + name + "}"
}

func lockChannel(name string) string      { return prefixName("redisson_lock__channel", name) }
func tokenKey(name string) string         { return prefixName("redisson_lock_token", name) }
func rwChannel(name string) string        { return prefixName("redisson_rwlock", name) }
func semaphoreChannel(name string) string { return prefixName("redisson_sc", name) }

// latchChannel ignores the brace rule, as Redisson does (docs/redisson.md
// §6.1).
func latchChannel(name string) string { return "redisson_countdownlatch__channel__{" + name + "}" }

// rwTimeoutPrefix is the prefix of a reader's per-hold keys: hold n of
// field lives at rwTimeoutPrefix(name, field) + ":n".
func rwTimeoutPrefix(name, field string) string {
	return suffixName(name, field) + ":rwlock_timeout"
}

// threadID maps an owner (dlock.WithOwner) to the "thread id" half of a
// holder field. Redisson writes a Java long in decimal there and only ever
// compares whole fields, so any string would do; a decimal keeps fields in
// Java's shape and keeps ':' and ":write" out of the owner's part, which the
// read-write lock's key names depend on. An owner that already is a
// non-negative decimal int64 is used as it is; any other owner is the
// FNV-1a 64-bit hash of its text with the top bit cleared. Two different
// owners thus share a field with odds of 2^-63.
func threadID(owner string) string {
	if n, err := strconv.ParseInt(owner, 10, 64); err == nil && n >= 0 && strconv.FormatInt(n, 10) == owner {
		return owner
	}
	h := fnv.New64a()
	h.Write([]byte(owner))
	return strconv.FormatUint(h.Sum64()&(1<<63-1), 10)
}
