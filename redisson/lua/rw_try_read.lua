-- rw_try_read: take or re-enter a read hold of a Redisson RReadWriteLock
-- (docs/redisson.md §4.2).
--
-- KEYS[1] the lock hash <name>: 'mode' ('read' or 'write') and one field per
--         holder with its count
-- KEYS[2] the reader's timeout prefix <{name}>:<field>:rwlock_timeout; hold
--         n of the reader lives in '<prefix>:n' ("1", with the hold's lease)
-- ARGV[1] lease in ms
-- ARGV[2] the reader field <client UUID>:<thread id>
-- ARGV[3] the same holder's write field <reader field>:write
-- returns: nil when taken, else the lock's PTTL in ms.
-- errors:  DLOCK_KIND when the key is a hash of another layout; WRONGTYPE
--          when it is no hash.
local k, lease = KEYS[1], tonumber(ARGV[1])
local mode = redis.call('HGET', k, 'mode')
if mode == false then
  if redis.call('EXISTS', k) == 1 then
    return redis.error_reply('DLOCK_KIND ' .. k .. ' a hash without mode (a Redisson RLock or a dlock lock)')
  end
  redis.call('HSET', k, 'mode', 'read', ARGV[2], 1)
  redis.call('SET', KEYS[2] .. ':1', 1, 'PX', lease)
  redis.call('PEXPIRE', k, lease)
  return nil
end
if mode == 'read' or (mode == 'write' and redis.call('HEXISTS', k, ARGV[3]) == 1) then
  local n = redis.call('HINCRBY', k, ARGV[2], 1)
  redis.call('SET', KEYS[2] .. ':' .. n, 1, 'PX', lease)
  local ttl = redis.call('PTTL', k)
  redis.call('PEXPIRE', k, math.max(ttl, lease))
  return nil
end
return redis.call('PTTL', k)
