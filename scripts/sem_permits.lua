-- sem_permits: set or change the total (sem_common.lua is prepended).
--
-- KEYS[1..6]  M, H, C, Q, QE (see sem_common.lua), and the channel
-- ARGV[1]     'set': set the total to ARGV[2] unless it is set already;
--             'add': add ARGV[2] (may be negative) to the total (unset: 0)
-- ARGV[2]     the number of permits
-- ARGV[3]     the Client's ID, for the release message
--
-- Returns {1 when changed else 0, message}. 'add' fails with DLOCK_NEGATIVE,
-- changing nothing, when the total would drop below zero. The message names
-- the waiters the change lets through.
local M, H, C, Q, QE, CH = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local op, n = ARGV[1], tonumber(ARGV[2])
purge(M, H, C, Q, QE, now_ms())
local _, total = available(M)
if op == 'set' then
  if total then return {0, ''} end
  redis.call('HSET', M, 'total', n)
else
  if (total or 0) + n < 0 then
    return redis.error_reply('DLOCK_NEGATIVE the total would drop to ' .. ((total or 0) + n))
  end
  redis.call('HSET', M, 'total', (total or 0) + n)
end
return {1, wake_servable(M, C, Q, CH, ARGV[3])}
