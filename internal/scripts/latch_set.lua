-- latch_set: set a latch's count unless it is counting (includes
-- latch_common.lua).
--
-- KEYS[1]  the latch key (see latch_common.lua)
-- ARGV[1]  the count (>= 1)
-- ARGV[2]  the idle expiry in ms; 0 for none
--
-- Returns 1 when set, 0 when the latch was already counting. A key of
-- another kind fails with DLOCK_KIND and is left untouched.
--#include latch_common.lua
local L = KEYS[1]
local v, bad = latch_state(L)
if bad then
  return bad
end
if v[2] then
  return 0
end
redis.call('HSET', L, 'k', 'latch', 'count', ARGV[1])
if not v[3] then
  -- A new incarnation: see latch_common.lua.
  redis.call('HSET', L, 'gen', string.format('%.0f', now_us()))
end
local idle = tonumber(ARGV[2])
if idle > 0 then
  redis.call('HSET', L, 'x', idle)
else
  redis.call('HDEL', L, 'x')
  redis.call('PERSIST', L)
end
touch(L, idle)
return 1
