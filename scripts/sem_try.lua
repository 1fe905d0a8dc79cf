-- sem_try: take n permits, or join the queue (sem_common.lua is prepended).
--
-- KEYS[1..6]  M, H, C, Q, QE (see sem_common.lua), and the channel
-- ARGV[1]     the permit ID (also the waiter ID while queued; random)
-- ARGV[2]     n, the permits wanted (>= 1)
-- ARGV[3]     the permit's lease in milliseconds
-- ARGV[4]     waiting mark lease in ms; 0 for a try that will not wait
--
-- ARGV[5]     the Client's ID, for the release message
--
-- Returns 1 when the permits were taken. Otherwise, if ARGV[4] > 0, queues
-- the request (once) and returns -(ms until the earliest permit lease or
-- waiting mark runs out, when someone may move), or 0 when unknown. Fails
-- with DLOCK_TOOMANY when n exceeds the total. When the purge of expired
-- permits or waiters lets queued requests through, it publishes so.
local M, H, C, Q, QE, CH = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local id, n, ttl, mark = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
if purge(M, H, C, Q, QE, now) > 0 then
  wake_servable(M, C, Q, CH, ARGV[5])
end
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
local next = nil
for _, z in ipairs({H, QE}) do
  local first = redis.call('ZRANGE', z, 0, 0, 'WITHSCORES')
  if first[1] and (not next or tonumber(first[2]) < next) then
    next = tonumber(first[2])
  end
end
if next and next > now then
  return -(next - now)
end
return 0
