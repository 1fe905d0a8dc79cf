-- sem_release: give a permit's permits back (includes sem_common.lua).
--
-- KEYS[1..6]  M, H, C, Q, QE (see sem_common.lua), and the channel
-- ARGV[1]     the permit ID
-- ARGV[2]     the releasing Client's ID, for the release message
-- ARGV[3..]   optional, at the end of a permit cohort (permit.go): the
--             requests of the Client's Acquires that waited for a local
--             handoff, in their order, as triples of the request ID, the
--             permits it needs and its waiting mark lease in ms
--
-- Returns {permits returned, messages...}: -1 when the permit is not held
-- (a second release, or its lease expired); then nothing changes. The
-- requests listed are queued at the tail, in their order (and so ahead of
-- the releasing caller's next request), with waiting marks. Then the
-- permits returned go at once to the waiters they serve (grant_servable in
-- sem_common.lua); the messages, one per waiter served, say so.
--#include sem_common.lua
local M, H, C, Q, QE, CH = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local id = ARGV[1]
local v, bad, now = sem_open(M, H, C, Q, QE)
if bad then
  return bad
end
if not redis.call('ZSCORE', H, id) then
  return {-1}
end
local n = tonumber(redis.call('HGET', C, id) or '0')
redis.call('HINCRBY', M, 'used', -n)
redis.call('ZREM', H, id)
redis.call('HDEL', C, id)
for i = 3, #ARGV - 2, 3 do
  if not redis.call('ZSCORE', Q, ARGV[i]) then
    enqueue(M, Q, ARGV[i])
  end
  redis.call('HSET', C, ARGV[i], ARGV[i + 1])
  redis.call('ZADD', QE, now + tonumber(ARGV[i + 2]), ARGV[i])
end
local reply = {n}
for _, msg in ipairs(grant_servable(M, H, C, Q, QE, CH, ARGV[2], now, v[5])) do
  reply[#reply + 1] = msg
end
touch(M, H, C, Q, QE, v[4])
return reply
