-- sem_try: take n permits, or join the queue (sem_common.lua is prepended).
--
-- KEYS[1..5]  M, H, C, Q, QE (see sem_common.lua)
-- ARGV[1]     the permit ID (also the waiter ID while queued; random)
-- ARGV[2]     n, the permits wanted (>= 1)
-- ARGV[3]     the permit's lease in milliseconds
-- ARGV[4]     waiting mark lease in ms; 0 for a try that will not wait
--
-- Returns 1 when the permits were taken. Otherwise, if ARGV[4] > 0, queues
-- the request (once) and returns -(ms until the earliest permit lease runs
-- out), or 0 when unknown. Fails with DLOCK_TOOMANY when n exceeds the total.
local M, H, C, Q, QE = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local id, n, ttl, mark = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
purge(M, H, C, Q, QE, now)
local avail, total = available(M)
if total and n > total then
  return redis.error_reply('DLOCK_TOOMANY ' .. n .. ' permits wanted, ' .. total .. ' in all')
end
local rank = redis.call('ZRANK', Q, id)
local ahead
if rank then
  ahead = needed(C, Q, 1, rank)
else
  ahead = needed(C, Q, 1, redis.call('ZCARD', Q))
end
if ahead + n <= avail then
  redis.call('HINCRBY', M, 'used', n)
  redis.call('ZADD', H, now + ttl, id)
  redis.call('HSET', C, id, n)
  redis.call('ZREM', Q, id)
  redis.call('ZREM', QE, id)
  return 1
end
if mark > 0 and not rank then
  redis.call('ZADD', Q, redis.call('HINCRBY', M, 'seq', 1), id)
  redis.call('ZADD', QE, now + mark, id)
  redis.call('HSET', C, id, n)
end
local first = redis.call('ZRANGE', H, 0, 0, 'WITHSCORES')
if first[1] then
  local left = tonumber(first[2]) - now
  if left > 0 then return -left end
end
return 0
