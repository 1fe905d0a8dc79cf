-- rw_force: release a Redisson RReadWriteLock whoever holds it
-- (docs/redisson.md §4.6): write mode publishes 1, read mode 0.
--
-- KEYS[1] the lock hash <name>
-- KEYS[2] the channel redisson_rwlock:{name}
-- ARGV[1] PUBLISH or SPUBLISH
-- returns: 1 when a hold was deleted, else 0.
local mode = redis.call('HGET', KEYS[1], 'mode')
if mode == false then
  return 0
end
redis.call('DEL', KEYS[1])
if mode == 'write' then
  redis.call(ARGV[1], KEYS[2], 1)
else
  redis.call(ARGV[1], KEYS[2], 0)
end
return 1
