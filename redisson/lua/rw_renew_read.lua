-- rw_renew_read: the watchdog renewal of one reader's holds of a Redisson
-- RReadWriteLock (docs/redisson.md §4.8).
--
-- KEYS[1] the lock hash <name>
-- KEYS[2] the reader's timeout prefix
-- ARGV[1] the lease in ms
-- ARGV[2] the reader field
-- returns: 1 when renewed; 0 when the reader holds nothing (lost).
--
-- Redisson sets the hash's TTL to the lease; this never shortens it, so a
-- longer lease of another holder stays.
local k, lease = KEYS[1], tonumber(ARGV[1])
local n = tonumber(redis.call('HGET', k, ARGV[2]))
if n == nil then
  return 0
end
for i = n, 1, -1 do
  redis.call('PEXPIRE', KEYS[2] .. ':' .. i, lease)
end
redis.call('PEXPIRE', k, math.max(redis.call('PTTL', k), lease))
return 1
