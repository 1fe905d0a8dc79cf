-- rw_try_write: take or re-enter the write hold of a Redisson
-- RReadWriteLock (docs/redisson.md §4.4).
--
-- KEYS[1] the lock hash <name>
-- ARGV[1] lease in ms
-- ARGV[2] the write field <client UUID>:<thread id>:write
-- returns: nil when taken, else the lock's PTTL in ms.
-- errors:  DLOCK_KIND when the key is a hash of another layout; WRONGTYPE
--          when it is no hash.
local k = KEYS[1]
local mode = redis.call('HGET', k, 'mode')
if mode == false then
  if redis.call('EXISTS', k) == 1 then
    return redis.error_reply('DLOCK_KIND ' .. k .. ' a hash without mode (a Redisson RLock or a dlock lock)')
  end
  redis.call('HSET', k, 'mode', 'write', ARGV[2], 1)
  redis.call('PEXPIRE', k, ARGV[1])
  return nil
end
if mode == 'write' and redis.call('HEXISTS', k, ARGV[2]) == 1 then
  redis.call('HINCRBY', k, ARGV[2], 1)
  -- Redisson adds the lease to what is left.
  redis.call('PEXPIRE', k, redis.call('PTTL', k) + tonumber(ARGV[1]))
  return nil
end
return redis.call('PTTL', k)
