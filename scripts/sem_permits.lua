-- sem_permits: set or change the total (includes sem_common.lua).
--
-- KEYS[1..6]  M, H, C, Q, QE (see sem_common.lua), and the channel
-- ARGV[1]     'set': set the total to ARGV[2] unless it is set already;
--             'force': set the total to ARGV[2];
--             'add': add ARGV[2] (may be negative) to the total (unset: 0)
-- ARGV[2]     the number of permits
-- ARGV[3]     the Client's ID, for the release message
-- ARGV[4]     the idle expiry in ms to record when this call sets the total
--             ('set', 'force'); 0 for none
--
-- Returns {1 when changed else 0, message}. 'add' fails, changing nothing,
-- with DLOCK_NEGATIVE when the total would drop below zero and with
-- DLOCK_TOOMANY when it would rise above max_permits. The message names the
-- waiters the change lets through.
--#include sem_common.lua
local M, H, C, Q, QE, CH = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local op, n, idle = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[4])
local v, bad = sem_state(M, H, C, Q, QE)
if bad then
  return bad
end
purge(M, H, C, Q, QE, now_ms())
local _, total = available(M)
local x = v[4]
if op == 'set' or op == 'force' then
  if op == 'set' and total then return {0, ''} end
  redis.call('HSET', M, 'k', 'semaphore', 'total', string.format('%.0f', n))
  if idle > 0 then
    redis.call('HSET', M, 'x', idle)
    x = idle
  else
    redis.call('HDEL', M, 'x')
    for _, k in ipairs({M, H, C, Q, QE}) do
      redis.call('PERSIST', k)
    end
    x = nil
  end
else
  local t = (total or 0) + n
  if t < 0 then
    return redis.error_reply('DLOCK_NEGATIVE the total would drop to ' .. string.format('%.0f', t))
  end
  if t > max_permits then
    return redis.error_reply('DLOCK_TOOMANY the total would rise above MaxPermits (' .. string.format('%.0f', max_permits) .. ')')
  end
  redis.call('HSET', M, 'k', 'semaphore', 'total', string.format('%.0f', t))
end
touch(M, H, C, Q, QE, x)
return {1, wake_servable(M, C, Q, CH, ARGV[3])}
