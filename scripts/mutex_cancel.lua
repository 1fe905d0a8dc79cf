-- mutex_cancel: a waiter stops waiting. It
-- leaves the queue, and if a release handed it the lock meanwhile, the lock
-- passes on as mutex_unlock would pass it.
--
-- KEYS[1..4]  K, Q, QE (see mutex_common.lua), and the channel
-- ARGV[1]     the waiter's token
-- ARGV[2]     the Client's ID, for a grant message
--
-- Returns 0 when the token did not hold the lock, 1 when it did and the lock
-- is now free, or the token of the waiter the lock was handed to (not
-- published when that waiter is on Client ARGV[2]).
local K, Q, QE, CH = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
redis.call('ZREM', Q, ARGV[1])
redis.call('ZREM', QE, ARGV[1])
if redis.call('GET', K) ~= ARGV[1] then
  return 0
end
--#include mutex_common.lua
return pass_on(K, Q, QE, CH, ARGV[2])
