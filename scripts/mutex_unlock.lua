-- mutex_unlock: release a plain lock if, and only if, the token still holds it.
--
-- KEYS[1]  the lock key
-- KEYS[2]  the lock's release channel
-- ARGV[1]  the holder's token
-- ARGV[2]  the release message (the releasing client's ID and how many to wake)
--
-- Returns 1 when released (and the message published), 0 when the token does
-- not hold the lock; then nothing changes.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', KEYS[2], ARGV[2])
  return 1
end
return 0
