-- force_unlock: delete a lock whoever holds it, and wake its waiters.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the lock's release channel
-- ARGV[1]  the release message
-- ARGV[2]  the type the lock key must have ('hash' or 'string')
--
-- Returns 1 when a lock was deleted, 0 when there was none. A key of another
-- type is never deleted: the call fails with WRONGTYPE.
local t = redis.call('TYPE', KEYS[1])['ok']
if t == 'none' then
  return 0
end
if t ~= ARGV[2] then
  return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', KEYS[2], ARGV[1])
return 1
