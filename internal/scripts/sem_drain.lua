-- sem_drain: take every permit that is free, unless someone is queued
-- (includes sem_common.lua).
--
-- KEYS[1..6]  M, H, C, Q, QE (see sem_common.lua), and the channel
-- ARGV[1]     the permit ID
-- ARGV[2]     the permit's lease in milliseconds
-- ARGV[3]     the Client's ID, for the release message
--
-- Returns {n, token}: the permits taken, as one permit with a fencing token,
-- or {0, ''} when none is free or waiters are queued (they come first; a
-- request for more than the total holds nobody back, see sem_common.lua).
-- Keys of another kind fail with DLOCK_KIND before anything changes.
--#include sem_common.lua
local M, H, C, Q, QE, CH = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local id, ttl = ARGV[1], tonumber(ARGV[2])
local v, bad, now = sem_open(M, H, C, Q, QE, CH, ARGV[3])
if bad then
  return bad
end
local n, total = available(M)
if n <= 0 or needed(C, Q, 1, redis.call('ZCARD', Q), total) > 0 then
  return busy(nil, '', '', 0)
end
local f = next_fence(v[5])
redis.call('HINCRBY', M, 'used', n)
redis.call('HSET', M, 'k', 'semaphore', 'f', f)
redis.call('ZADD', H, now + ttl, id)
redis.call('HSET', C, id, n)
touch(M, H, C, Q, QE, v[4])
return held(n, f)
