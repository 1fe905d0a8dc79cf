-- rw_unlock_read: release one read hold of a Redisson RReadWriteLock
-- (docs/redisson.md §4.3), without the unlock latch.
--
-- KEYS[1] the lock hash <name>
-- KEYS[2] the channel redisson_rwlock:{name}
-- KEYS[3] the reader's timeout prefix <{name}>:<field>:rwlock_timeout
-- KEYS[4] the key prefix <{name}> every holder's timeout keys start with
-- ARGV[1] the reader field
-- ARGV[2] PUBLISH or SPUBLISH
-- returns: nil when the field holds no read hold; 0 when the lock is still
--          held (by other readers, a writer, or the caller again); 1 when it
--          was released (and 0 published).
--
-- Unlike Redisson it publishes nothing when the lock is gone altogether:
-- that wake-up is spurious, and nobody waits on it.
local k, field = KEYS[1], ARGV[1]
local mode = redis.call('HGET', k, 'mode')
if mode == false or redis.call('HEXISTS', k, field) == 0 then
  return nil
end
local left = redis.call('HINCRBY', k, field, -1)
if left == 0 then
  redis.call('HDEL', k, field)
end
redis.call('DEL', KEYS[3] .. ':' .. (left + 1))
if redis.call('HLEN', k) > 1 then
  -- Keep the hash as long as the longest read hold left, as Redisson does.
  local longest = -3
  local all = redis.call('HGETALL', k)
  for i = 1, #all, 2 do
    local n = tonumber(all[i + 1])
    if n ~= nil then
      for j = n, 1, -1 do
        local ttl = redis.call('PTTL', KEYS[4] .. ':' .. all[i] .. ':rwlock_timeout:' .. j)
        if ttl > longest then
          longest = ttl
        end
      end
    end
  end
  if longest > 0 then
    redis.call('PEXPIRE', k, longest)
    return 0
  end
  if mode == 'write' then
    return 0
  end
end
redis.call('DEL', k)
redis.call(ARGV[2], KEYS[2], 0)
return 1
