-- sem_release: give permits back to a Redisson RSemaphore, or add them
-- (docs/redisson.md §5.2). Permits have no owner.
--
-- KEYS[1] the semaphore <name>
-- KEYS[2] the channel redisson_sc:{name}
-- ARGV[1] permits to add, > 0
-- ARGV[2] PUBLISH or SPUBLISH
-- returns: the permits available now (also the message published).
-- errors:  DLOCK_KIND when the value is not an integer; WRONGTYPE when the
--          key is no string. Nothing is written then.
local old = redis.call('GET', KEYS[1])
if old ~= false and tonumber(old) == nil then
  return redis.error_reply('DLOCK_KIND ' .. KEYS[1] .. ' a string that is not a permit count')
end
local v = redis.call('INCRBY', KEYS[1], ARGV[1])
redis.call(ARGV[2], KEYS[2], v)
return v
