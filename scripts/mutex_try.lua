-- mutex_try: take a plain (non-reentrant) lock, or join its queue.
--
-- KEYS[1..4]  K, Q, QE (see mutex_common.lua), and the channel
-- ARGV[1]     the caller's token (fresh per Lock call)
-- ARGV[2]     lease in milliseconds
-- ARGV[3]     waiting mark lease in ms; 0 for a try that will not wait
-- ARGV[4]     the Client's ID, for a grant message
--
-- Returns {1, ''} when the caller holds the lock: it was free with nobody
-- queued ahead, or a release had already handed it to ARGV[1] (then the
-- lease is reset to ARGV[2]). Otherwise returns {-(remaining lease in ms),
-- the holder's token}, with 0 for a key with no expiry, and, if ARGV[3] > 0,
-- queues the caller (once) and sets its mark to expire ARGV[3] ms from now.
-- A free lock with others queued goes to the first of them, as a release
-- would (then it is the holder returned). A key of another type fails with WRONGTYPE before anything changes.
local K, Q, QE, CH = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local token, lease, mark = ARGV[1], ARGV[2], tonumber(ARGV[3])
local holder = redis.call('GET', K) -- WRONGTYPE when not a string lock
if holder == token then
  redis.call('PEXPIRE', K, lease)
  return {1, ''}
end
--#include mutex_common.lua
local s, us = now_parts()
local now = s * 1000 + math.floor(us / 1000)
local queued = redis.call('EXISTS', Q) == 1
if queued then
  purge(Q, QE, now)
end
if not holder then
  local first = queued and redis.call('ZRANGE', Q, 0, 0)[1]
  if first and first ~= token then
    holder = grant_first(K, Q, QE, CH, ARGV[4], now)
  end
  if not holder or holder == token then
    redis.call('SET', K, token, 'PX', lease)
    if queued then
      redis.call('ZREM', Q, token)
      redis.call('ZREM', QE, token)
    end
    return {1, ''}
  end
end
if mark > 0 then
  if not redis.call('ZSCORE', Q, token) then
    redis.call('ZADD', Q, string.format('%d%06d', s, us), token)
  end
  redis.call('ZADD', QE, now + mark, token)
  for _, z in ipairs({Q, QE}) do
    if redis.call('PTTL', z) < mark then
      redis.call('PEXPIRE', z, mark)
    end
  end
end
local ttl = redis.call('PTTL', K)
if ttl < 0 then
  ttl = 0
end
return {-ttl, holder}
