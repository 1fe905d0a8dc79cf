-- rw_try_read: take or re-enter a read hold (rw_common.lua is prepended).
--
-- KEYS[1..4]  W, RL, RC, WW (see rw_common.lua)
-- ARGV[1]     the owner ID
-- ARGV[2]     lease in milliseconds
--
-- Returns the owner's read hold count (>= 1). A new owner is refused while
-- another owner writes or a writer waits; the writer itself may also read
-- (downgrade), and an owner that already reads may re-enter even when a
-- writer waits, or it would deadlock. Re-entry keeps the lease of the
-- owner's first read hold. When refused, returns -(ms until the
-- blocking writer's lease or waiting mark runs out), or 0 when unknown.
local W, RL, RC, WW = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, ttl = ARGV[1], tonumber(ARGV[2])
local now = now_ms()
purge(RL, RC, WW, now)
local is_writer = redis.call('HEXISTS', W, owner) == 1
if not is_writer and redis.call('HLEN', W) > 0 then
  local left = redis.call('PTTL', W)
  if left > 0 then return -left end
  return 0
end
if not is_writer and redis.call('HEXISTS', RC, owner) == 0 then
  local first = redis.call('ZRANGE', WW, 0, 0, 'WITHSCORES')
  if first[1] then
    return -math.max(tonumber(first[2]) - now, 1)
  end
end
local n = redis.call('HINCRBY', RC, owner, 1)
if n == 1 then
  -- Like reentrant_try.lua: the first hold's lease governs the whole hold.
  redis.call('ZADD', RL, now + ttl, owner)
  extend(RL, ttl)
  extend(RC, ttl)
end
return n
