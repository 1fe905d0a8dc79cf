-- sem_available: free permits after purging expired ones (sem_common.lua is
-- prepended).
--
-- KEYS[1..6]  M, H, C, Q, QE (see sem_common.lua), and the channel
-- ARGV[1]     the Client's ID, for the release message
--
-- Returns total - used: negative after the total was lowered below the
-- permits in use, 0 when the total was never set. When the purge lets
-- queued requests through, it publishes so.
local M, H, C, Q, QE, CH = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
if purge(M, H, C, Q, QE, now_ms()) > 0 then
  wake_servable(M, C, Q, CH, ARGV[1])
end
return (available(M))
