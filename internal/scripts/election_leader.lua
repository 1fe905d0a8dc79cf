-- election_leader: who leads an election, and with what value. It changes
-- nothing.
--
-- KEYS[1]  K (see excl_common.lua)
--
-- Returns {leader's ID, its value, ms its lease has left, its fencing
-- token} once the leader has proclaimed its value, else {} (no leader, or
-- one elected a moment ago that has not yet published its value). Keys of
-- another kind fail with DLOCK_KIND.
--#include lib.lua
local K = KEYS[1]
local v, bad = main_key(K, 'election', 'o', 'f')
if bad then
  return bad
end
local id = v[2]
if not id then
  return {}
end
local value = redis.call('HGET', K, 'v:' .. id)
if not value then
  return {}
end
return {id, value, math.max(redis.call('PTTL', K), 0), v[3] or ''}
