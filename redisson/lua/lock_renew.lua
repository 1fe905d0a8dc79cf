-- lock_renew: the batched watchdog renewal of RLocks and write locks
-- (docs/redisson.md §7.3). All keys are in one cluster slot.
--
-- KEYS[i]   a lock hash
-- ARGV[1]   the lease in ms to renew to
-- ARGV[i+1] the holder field renewed on KEYS[i]
-- returns:  an array, 1 for each KEYS[i] renewed, 0 for each whose field
--           is gone (the hold was lost).
local out = {}
for i, k in ipairs(KEYS) do
  if redis.call('HEXISTS', k, ARGV[i + 1]) == 1 then
    redis.call('PEXPIRE', k, ARGV[1])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
