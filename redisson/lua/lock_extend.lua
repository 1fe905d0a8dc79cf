-- lock_extend: set the lease of a hold the caller has, whether that
-- lengthens or shortens it.
--
-- KEYS[1] the lock hash
-- ARGV[1] the lease in ms
-- ARGV[2] the holder field
-- returns: 1 when set, 0 when the field does not hold the lock.
if redis.call('HEXISTS', KEYS[1], ARGV[2]) == 0 then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
