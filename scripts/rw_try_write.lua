-- rw_try_write: take or re-enter the write hold (rw_common.lua is prepended).
--
-- KEYS[1..4]  W, RL, RC, WW (see rw_common.lua)
-- ARGV[1]     the owner ID
-- ARGV[2]     lease in milliseconds
-- ARGV[3]     waiting mark lease in ms; 0 for a try that will not wait
--
-- Returns the owner's write hold count (>= 1). An owner that reads without
-- writing gets the error DLOCK_UPGRADE: waiting for its own read hold to end
-- would deadlock. When others hold the lock, sets the owner's waiting mark
-- (if ARGV[3] > 0) and returns -(ms until the earliest blocking lease runs
-- out), or 0 when unknown.
local W, RL, RC, WW = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, ttl, mark = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()
purge(RL, RC, WW, now)
if redis.call('HEXISTS', W, owner) == 1 then
  return redis.call('HINCRBY', W, owner, 1)
end
if redis.call('HEXISTS', RC, owner) == 1 then
  return redis.error_reply('DLOCK_UPGRADE the owner holds a read lock')
end
local writing = redis.call('HLEN', W) > 0
if not writing and redis.call('ZCARD', RL) == 0 then
  redis.call('HSET', W, owner, 1)
  redis.call('PEXPIRE', W, ttl)
  redis.call('ZREM', WW, owner)
  return 1
end
if mark > 0 then
  redis.call('ZADD', WW, now + mark, owner)
  extend(WW, mark)
end
local left
if writing then
  left = redis.call('PTTL', W)
else
  left = tonumber(redis.call('ZRANGE', RL, 0, 0, 'WITHSCORES')[2]) - now
end
if left > 0 then return -left end
return 0
