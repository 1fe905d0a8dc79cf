-- mutex_unlock: release a plain lock if, and only if, the token holds it.
-- The uncontended case runs before mutex_common.lua is included, so that it
-- does not pay for defining functions it never calls.
--
-- KEYS[1..4]  K, Q, QE (see mutex_common.lua), and the channel
-- ARGV[1]     the holder's token
-- ARGV[2]     the Client's ID, for a grant message
--
-- Returns 0 when the token does not hold the lock (nothing changes), 1 when
-- the lock was freed with nobody waiting (nothing is published), or the
-- token of the queued waiter it was handed to (see mutex_common.lua).
local K, Q, QE, CH = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
if redis.call('GET', K) ~= ARGV[1] then
  return 0
end
if redis.call('EXISTS', Q) == 0 then
  redis.call('DEL', K)
  return 1
end
--#include mutex_common.lua
return pass_on(K, Q, QE, CH, ARGV[2])
