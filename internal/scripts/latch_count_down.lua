-- latch_count_down: count a latch down by one (includes latch_common.lua).
--
-- KEYS[1]  the latch key (see latch_common.lua)
-- KEYS[2]  the latch's channel
-- ARGV[1]  the Client's ID, for the release message
--
-- Returns the count after the call. At zero the count is removed, so that
-- the latch can be set again, the generation is bumped, and every waiter is
-- woken. A latch at zero stays at zero. A key of another kind fails with
-- DLOCK_KIND and is left untouched.
--#include latch_common.lua
local L = KEYS[1]
local v, bad = latch_state(L)
if bad then
  return bad
end
if not v[2] then
  return 0
end
local n = redis.call('HINCRBY', L, 'count', -1)
touch(L, v[4])
if n > 0 then
  return n
end
redis.call('HDEL', L, 'count')
redis.call('HINCRBY', L, 'gen', 1)
redis.call('PUBLISH', KEYS[2], msg_wake(ARGV[1], 0))
return 0
