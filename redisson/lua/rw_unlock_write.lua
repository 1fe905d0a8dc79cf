-- rw_unlock_write: release one write hold of a Redisson RReadWriteLock
-- (docs/redisson.md §4.5), without the unlock latch.
--
-- KEYS[1] the lock hash <name>
-- KEYS[2] the channel redisson_rwlock:{name}
-- ARGV[1] the lease in ms the remaining write holds keep
-- ARGV[2] the write field
-- ARGV[3] PUBLISH or SPUBLISH
-- returns: nil when the field holds no write hold; 0 when a re-entry was
--          undone; 1 when the write hold was released: the lock is free (and
--          1 was published) or left in read mode to the same holder.
local k, field = KEYS[1], ARGV[2]
if redis.call('HGET', k, 'mode') ~= 'write' or redis.call('HEXISTS', k, field) == 0 then
  return nil
end
local left = redis.call('HINCRBY', k, field, -1)
if left > 0 then
  redis.call('PEXPIRE', k, ARGV[1])
  return 0
end
redis.call('HDEL', k, field)
if redis.call('HLEN', k) == 1 then
  redis.call('DEL', k)
  redis.call(ARGV[3], KEYS[2], 1)
else
  redis.call('HSET', k, 'mode', 'read')
end
return 1
