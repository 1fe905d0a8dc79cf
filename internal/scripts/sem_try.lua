-- sem_try: take n permits, or join the queue (includes sem_common.lua).
--
-- KEYS[1..6]  M, H, C, Q, QE (see sem_common.lua), and the channel
-- ARGV[1]     the permit ID (also the waiter ID while queued; random)
-- ARGV[2]     n, the permits wanted (>= 1)
-- ARGV[3]     the permit's lease in milliseconds
-- ARGV[4]     waiting mark lease in ms; 0 for a try that will not wait
-- ARGV[5]     the Client's ID, for the release message
--
-- Returns {1, token} when the permits were taken, or a release had granted
-- them to this waiter, with the permit's fencing token. Otherwise, if ARGV[4] > 0, queues the request (once) and returns
-- {-(ms until the earliest permit lease or waiting mark runs out, at least
-- 1; 0 when none), '', '', 1 when this try queued it anew else 0, 1 when
-- the total was never set else 0}. When the purge of expired permits or
-- waiters lets queued requests through, it publishes so. Keys of another
-- kind fail with DLOCK_KIND before anything changes.
--
-- A total that was never set persists nothing: the keys a waiter writes
-- then expire with the waiting marks (one mark lease after the last try or
-- renewal). The watchdog's renewals of a mark prolong QE, Q and M; C, which
-- they do not reach, each try of a waiter prolongs, and the reply has the
-- waiter try again within half a mark lease. Setting the total makes the
-- keys persist (sem_permits.lua).
--#include sem_common.lua
local M, H, C, Q, QE, CH = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local id, n, ttl, mark = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local v, bad, now = sem_open(M, H, C, Q, QE, CH, ARGV[5])
if bad then
  return bad
end
-- A permit a release granted this waiter (grant_servable, sem_common.lua)
-- that it did not take from the message: claimed, with this try's lease
-- and a new token, since the message's was never returned to anyone.
if redis.call('ZSCORE', H, id) then
  local f = next_fence(v[5])
  redis.call('HSET', M, 'f', f)
  redis.call('ZADD', H, now + ttl, id)
  touch(M, H, C, Q, QE, v[4])
  return held(1, f)
end
local avail, total = available(M)
local rank = redis.call('ZRANK', Q, id)
-- The requests ahead are summed only when the free permits cover this one
-- alone: under contention they seldom do, and the sum reads every queued
-- request's need.
if n <= avail and n + needed(C, Q, 1, rank or redis.call('ZCARD', Q), total) <= avail then
  local f = next_fence(v[5])
  redis.call('HINCRBY', M, 'used', n)
  redis.call('HSET', M, 'k', 'semaphore', 'f', f)
  redis.call('ZADD', H, now + ttl, id)
  redis.call('HSET', C, id, n)
  redis.call('ZREM', Q, id)
  redis.call('ZREM', QE, id)
  touch(M, H, C, Q, QE, v[4])
  return held(1, f)
end
local added = 0
if mark > 0 then
  if not rank then
    redis.call('HSET', M, 'k', 'semaphore')
    enqueue(M, Q, id)
    added = 1
  end
  -- Each try records the need again: C may have expired (see above).
  redis.call('HSET', C, id, n)
  redis.call('ZADD', QE, now + mark, id)
  if total then
    touch(M, H, C, Q, QE, v[4])
  else
    for _, k in ipairs({M, H, C, Q, QE}) do
      extend(k, mark)
    end
  end
end
local next = nil
for _, z in ipairs({H, QE}) do
  local first = redis.call('ZRANGE', z, 0, 0, 'WITHSCORES')
  if first[1] and (not next or tonumber(first[2]) < next) then
    next = tonumber(first[2])
  end
end
if not total and mark > 0 then
  next = math.min(next or now + mark, now + math.floor(mark / 2))
end
return busy(next and next - now, '', '', added, total and '' or 'unset')
