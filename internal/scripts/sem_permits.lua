-- sem_permits: set or change the total (includes sem_common.lua).
--
-- KEYS[1..6]  M, H, C, Q, QE (see sem_common.lua), and the channel
-- ARGV[1]     'set': set the total to ARGV[2] unless it is set already;
--             'force': set the total to ARGV[2];
--             'add': add ARGV[2] (may be negative) to the total (unset: 0)
-- ARGV[2]     the number of permits
-- ARGV[3]     the Client's ID, for the release message
-- ARGV[4]     the idle expiry in ms to record when this call sets the total
--             ('set', 'force', or 'add' to a total never set); 0 for none
--
-- Setting a total that was never set makes the keys that waiters wrote
-- meanwhile, which expire with their marks, persist (or follow the idle
-- expiry), and wakes every waiter to try again.
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
if op == 'set' and total then
  return {0, ''}
end
local t = n
if op == 'add' then
  t = (total or 0) + n
  if t < 0 then
    return redis.error_reply('DLOCK_NEGATIVE the total would drop to ' .. string.format('%.0f', t))
  end
  if t > max_permits then
    return redis.error_reply('DLOCK_TOOMANY the total would rise above MaxPermits (' .. string.format('%.0f', max_permits) .. ')')
  end
end
redis.call('HSET', M, 'k', 'semaphore', 'total', string.format('%.0f', t))
local x = v[4]
if op ~= 'add' or not total then
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
end
touch(M, H, C, Q, QE, x)
if not total and redis.call('EXISTS', Q) == 1 then
  -- Waiters of an unset total look again at their shortened interval (see
  -- sem_try.lua); wake them all, so that those it does not serve requeue on
  -- the usual terms.
  local msg = msg_wake(ARGV[3], 0)
  redis.call('PUBLISH', CH, msg)
  return {1, msg}
end
return {1, wake_servable(M, C, Q, CH, ARGV[3])}
