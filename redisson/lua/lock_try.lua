-- lock_try: take or re-enter a Redisson RLock (docs/redisson.md §3.2), or,
-- with a token key, an RFencedLock (§3.8).
--
-- KEYS[1] the lock hash <name>
-- KEYS[2] optional: the fenced lock's token counter redisson_lock_token:{name}
-- ARGV[1] lease in ms
-- ARGV[2] the holder field <client UUID>:<thread id>
-- returns: without KEYS[2]: nil when taken or re-entered, else the lock's
--          PTTL in ms (-1: a key without TTL);
--          with KEYS[2]: {1, token} when taken, else {0, PTTL}. (Redisson's
--          own script answers {-1, token} and {PTTL, -1}, which a lock key
--          without TTL makes ambiguous.)
-- errors:  DLOCK_KIND when the key is a hash of dlock's own layout or a
--          Redisson read-write lock; WRONGTYPE when it is no hash. Nothing is
--          written then.
local k, field = KEYS[1], ARGV[2]
local found = redis.call('EXISTS', k) == 0 or redis.call('HEXISTS', k, field) == 1
if found then
  if redis.call('HEXISTS', k, 'mode') == 1 then
    return redis.error_reply('DLOCK_KIND ' .. k .. ' a Redisson read-write lock')
  end
  local token = nil
  if KEYS[2] then
    token = redis.call('INCR', KEYS[2])
  end
  redis.call('HINCRBY', k, field, 1)
  redis.call('PEXPIRE', k, ARGV[1])
  if token then
    return {1, token}
  end
  return nil
end
-- Held by another holder: make sure it is a Redisson lock before answering.
if redis.call('HEXISTS', k, 'k') == 1 then
  return redis.error_reply('DLOCK_KIND ' .. k .. ' a dlock lock')
end
if redis.call('HEXISTS', k, 'mode') == 1 then
  return redis.error_reply('DLOCK_KIND ' .. k .. ' a Redisson read-write lock')
end
local ttl = redis.call('PTTL', k)
if KEYS[2] then
  return {0, ttl}
end
return ttl
