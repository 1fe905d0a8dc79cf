-- sem_set: Redisson's trySetPermits (docs/redisson.md §5.2).
--
-- KEYS[1] the semaphore <name>
-- KEYS[2] the channel redisson_sc:{name}
-- ARGV[1] the permits, >= 0
-- ARGV[2] PUBLISH or SPUBLISH
-- errors:  DLOCK_KIND when the key is no string.
-- returns: 1 when set, 0 when the semaphore already existed.
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'none' then
  if t ~= 'string' then
    return redis.error_reply('DLOCK_KIND ' .. KEYS[1] .. ' a ' .. t .. ', not a semaphore')
  end
  return 0
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call(ARGV[2], KEYS[2], ARGV[1])
return 1
