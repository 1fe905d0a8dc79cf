-- reentrant_unlock: drop one hold of an owner; the last one releases the lock.
--
-- KEYS[1]  the lock key (hash: owner ID -> hold count)
-- KEYS[2]  the lock's release channel
-- ARGV[1]  the owner ID
-- ARGV[2]  the release message
--
-- Returns the owner's remaining hold count (0 means released and the message
-- published), or -1 when the owner holds nothing; then nothing changes.
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  return -1
end
local n = redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
if n > 0 then
  return n
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', KEYS[2], ARGV[2])
return 0
