-- mutex_try: take a plain (non-reentrant) lock, or report how long it stays held.
--
-- KEYS[1]  the lock key (a string holding the holder's token)
-- ARGV[1]  the new holder's token (random, fresh per acquisition)
-- ARGV[2]  lease in milliseconds
--
-- Returns 1 when acquired. Otherwise returns -(remaining lease in ms), or 0
-- when the key has no expiry. A key of another type fails with WRONGTYPE and
-- is left untouched.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 1
end
redis.call('GET', KEYS[1]) -- raises WRONGTYPE when the key is not a string lock
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then
  return -ttl
end
return 0
