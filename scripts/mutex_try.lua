-- mutex_try: take a plain (non-reentrant) lock, or report how long it stays held.
--
-- KEYS[1]  the lock key (a string holding the holder's token)
-- ARGV[1]  the new holder's token (random, fresh per acquisition)
-- ARGV[2]  lease in milliseconds
--
-- Returns {1, ''} when acquired. Otherwise returns {-(remaining lease in
-- ms), the holder's token}, with 0 for a key with no expiry. A key of another
-- type fails with WRONGTYPE and is left untouched.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, ''}
end
local holder = redis.call('GET', KEYS[1]) -- WRONGTYPE when not a string lock
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then
  ttl = 0
end
return {-ttl, holder or ''}
