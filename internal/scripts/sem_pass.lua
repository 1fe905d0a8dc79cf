-- sem_pass: a permit handed on within its Client (a permit cohort, see
-- Semaphore in semaphore.go) gets its new holder's fencing token, and the
-- new holder's own request leaves the queue (includes sem_common.lua).
--
-- KEYS[1..6]  M, H, C, Q, QE (see sem_common.lua), and the channel
-- ARGV[1]     the permit ID: the Redis grant the cohort holds on
-- ARGV[2]     the new holder's request ID: its place in the queue, if any
-- ARGV[3]     the Client's ID, for the release message
--
-- Returns {token, messages...}. token is the next fencing token (M's f),
-- issued to the new holder, or 0 when the permit is no longer held (its
-- lease ran out, or it was released, or the semaphore deleted), or when
-- the total was lowered below the permits in use (the permit then goes
-- back): the new holder has then lost it. The token is issued here, after the new holder
-- began, rather than reserved at the Redis grant: other Clients' permits
-- are granted while a cohort runs, and every token must be above every
-- token issued before it for the name. The request leaves the queue, and
-- permits a release granted it meanwhile go back, as sem_cancel does; the
-- messages name the requests those serve now (grant_servable).
--#include sem_common.lua
local M, H, C, Q, QE, CH = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local id, w, from = ARGV[1], ARGV[2], ARGV[3]
local v, bad, now = sem_open(M, H, C, Q, QE, CH, from)
if bad then
  return bad
end
local reply = {0}
local freed = false
-- (sem_open purged expired permits: a permit still in H is live.)
if redis.call('ZSCORE', H, id) then
  local avail, total = available(M)
  if total and avail >= 0 then
    local f = next_fence(v[5])
    redis.call('HSET', M, 'f', f)
    reply[1], v[5] = tonumber(f), f -- (below 2^53: an exact integer reply)
  else
    -- The total was lowered below the permits in use (or is gone): the
    -- handoff is a new acquisition the total no longer allows. The
    -- permits go back, and the new holder has lost them.
    redis.call('HINCRBY', M, 'used', -tonumber(redis.call('HGET', C, id) or '0'))
    redis.call('ZREM', H, id)
    redis.call('HDEL', C, id)
    freed = true
  end
end
if redis.call('ZREM', Q, w) == 1 then
  redis.call('ZREM', QE, w)
  redis.call('HDEL', C, w)
  freed = true -- a request ahead of others: those behind may be served now
elseif redis.call('ZSCORE', H, w) then
  redis.call('HINCRBY', M, 'used', -tonumber(redis.call('HGET', C, w) or '0'))
  redis.call('ZREM', H, w)
  redis.call('HDEL', C, w)
  freed = true
end
if freed then
  for _, msg in ipairs(grant_servable(M, H, C, Q, QE, CH, from, now, v[5])) do
    reply[#reply + 1] = msg
  end
end
touch(M, H, C, Q, QE, v[4])
return reply
