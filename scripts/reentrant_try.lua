-- reentrant_try: take a reentrant lock for an owner, or re-enter it.
--
-- KEYS[1]  the lock key (a hash: field = owner ID, value = hold count)
-- ARGV[1]  the owner ID
-- ARGV[2]  lease in milliseconds, applied when the lock is first taken
--
-- Returns {the owner's hold count after this acquisition (>= 1), ''}. When
-- another owner holds the lock, returns {-(remaining lease in ms), that
-- owner's ID}, with 0 for a key with no expiry. Re-entry does not change the expiry: the first acquisition's
-- lease (renewed by the watchdog or not) governs the whole hold. A key of
-- another type fails with WRONGTYPE and is left untouched.
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], ARGV[1], 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, ''}
end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  return {redis.call('HINCRBY', KEYS[1], ARGV[1], 1), ''}
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then
  ttl = 0
end
return {-ttl, redis.call('HKEYS', KEYS[1])[1] or ''}
