-- lock_force: release a Redisson RLock whoever holds it (docs/redisson.md
-- §3.4).
--
-- KEYS[1] the lock hash <name>
-- KEYS[2] the channel redisson_lock__channel:{name}
-- ARGV[1] PUBLISH or SPUBLISH
-- returns: 1 when a hold was deleted (and 0 published), else 0.
-- errors:  DLOCK_KIND when the key is not a Redisson lock hash (nothing is
--          deleted then).
local k = KEYS[1]
local t = redis.call('TYPE', k)['ok']
if t == 'none' then
  return 0
end
if t ~= 'hash' then
  return redis.error_reply('DLOCK_KIND ' .. k .. ' a ' .. t)
end
if redis.call('HEXISTS', k, 'k') == 1 then
  return redis.error_reply('DLOCK_KIND ' .. k .. ' a dlock lock')
end
if redis.call('HEXISTS', k, 'mode') == 1 then
  return redis.error_reply('DLOCK_KIND ' .. k .. ' a Redisson read-write lock')
end
redis.call('DEL', k)
redis.call(ARGV[1], KEYS[2], 0)
return 1
