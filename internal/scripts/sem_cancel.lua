-- sem_cancel: take a waiter that stops waiting out of the queue, giving
-- back the permits a release granted it meanwhile (includes
-- sem_common.lua); those behind it may now be served.
--
-- KEYS[1..6]  M, H, C, Q, QE (see sem_common.lua), and the channel
-- ARGV[1]     the waiter ID
-- ARGV[2]     the Client's ID, for the release message
--
-- Returns the message published for the waiters now served, or ''.
--#include sem_common.lua
local M, H, C, Q, QE, CH = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local id = ARGV[1]
local _, bad = sem_open(M, H, C, Q, QE)
if bad then
  return bad
end
if redis.call('ZREM', Q, id) == 0 then
  -- Not queued: a release may have granted it permits (grant_servable,
  -- sem_common.lua) that it will not take. They go back.
  local n = redis.call('ZSCORE', H, id) and tonumber(redis.call('HGET', C, id) or '0')
  if not n then
    return ''
  end
  redis.call('HINCRBY', M, 'used', -n)
  redis.call('ZREM', H, id)
  redis.call('HDEL', C, id)
  return wake_servable(M, C, Q, CH, ARGV[2])
end
redis.call('ZREM', QE, id)
if not redis.call('ZSCORE', H, id) then
  redis.call('HDEL', C, id)
end
return wake_servable(M, C, Q, CH, ARGV[2])
