-- sem_try: take permits of a Redisson RSemaphore (docs/redisson.md §5.2).
--
-- KEYS[1] the semaphore <name>: a string, the permits available
-- ARGV[1] permits to take, > 0
-- returns: 1 when taken, 0 when fewer are available (a missing key has 0).
-- errors:  DLOCK_KIND when the value is not an integer; WRONGTYPE when the
--          key is no string.
local v = redis.call('GET', KEYS[1])
if v == false then
  return 0
end
local n = tonumber(v)
if n == nil then
  return redis.error_reply('DLOCK_KIND ' .. KEYS[1] .. ' a string that is not a permit count')
end
if n >= tonumber(ARGV[1]) then
  redis.call('DECRBY', KEYS[1], ARGV[1])
  return 1
end
return 0
