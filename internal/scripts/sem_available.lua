-- sem_available: free permits and the total, after purging expired permits
-- (includes sem_common.lua).
--
-- KEYS[1..6]  M, H, C, Q, QE (see sem_common.lua), and the channel
-- ARGV[1]     the Client's ID, for the release message
--
-- Returns {total - used (negative after the total was lowered below the
-- permits in use), the total or -1 when never set, live waiters queued}.
-- When the purge lets queued requests through, it publishes so.
--#include sem_common.lua
local M, H, C, Q, QE, CH = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local _, bad = sem_state(M, H, C, Q, QE)
if bad then
  return bad
end
if purge(M, H, C, Q, QE, now_ms()) > 0 then
  wake_servable(M, C, Q, CH, ARGV[1])
end
local avail, total = available(M)
return {avail, total or -1, redis.call('ZCARD', Q)}
