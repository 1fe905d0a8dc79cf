-- rw_unlock_read: drop one read hold of an RWMutex (includes
-- rw_common.lua). When the last reader leaves, the first writer queued gets
-- the lock (see rw_common.lua).
--
-- KEYS[1..7]  W, RL, RC, Q, QE, F (see rw_common.lua), and the channel
-- ARGV[1]     the owner ID
-- ARGV[2]     the Client's ID, for a grant message
--
-- Returns {-1, ''} when the owner reads nothing (nothing changes), {n, ''}
-- when it has n read holds left, or {0, owners, token}: released, and the
-- lock handed to the owners listed ('' for none) with the writer's token
-- (or '').
--#include rw_common.lua
local W, RL, RC, Q, QE, F, CH = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local owner, from = ARGV[1], ARGV[2]
local v, bad = rw_open(W, RL, RC, Q, QE, 'f')
if bad then
  return bad
end
local now = now_ms()
purge(RL, RC, Q, QE, now)
if redis.call('HEXISTS', RC, owner) == 0 then
  return {-1, ''}
end
local n = redis.call('HINCRBY', RC, owner, -1)
if n > 0 then
  return {n, ''}
end
redis.call('HDEL', RC, owner)
redis.call('ZREM', RL, owner)
local to, f, ttl = admit(false, W, F, RL, RC, Q, QE, CH, from, now, v[2])
return {0, to, f, ttl}
