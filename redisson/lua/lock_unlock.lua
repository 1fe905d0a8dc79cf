-- lock_unlock: release one hold of a Redisson RLock or RFencedLock
-- (docs/redisson.md §3.3), without the unlock latch key: Go never replays an
-- unlock script (see "What the protocol cannot give").
--
-- KEYS[1] the lock hash <name>
-- KEYS[2] the channel redisson_lock__channel:{name}
-- ARGV[1] the lease in ms the remaining holds keep (the hold's lease)
-- ARGV[2] the holder field
-- ARGV[3] PUBLISH or SPUBLISH
-- returns: nil when the field does not hold the lock; 0 when one re-entry
--          was undone and the lock is still held; 1 when it was released
--          (and 0, Redisson's unlock message, was published).
local k, field = KEYS[1], ARGV[2]
if redis.call('HEXISTS', k, field) == 0 then
  return nil
end
local left = redis.call('HINCRBY', k, field, -1)
if left > 0 then
  redis.call('PEXPIRE', k, ARGV[1])
  return 0
end
redis.call('DEL', k)
redis.call(ARGV[3], KEYS[2], 0)
return 1
