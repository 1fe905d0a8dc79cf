-- sem_available: free permits after purging expired ones (sem_common.lua is
-- prepended).
--
-- KEYS[1..5]  M, H, C, Q, QE (see sem_common.lua)
--
-- Returns total - used: negative after the total was lowered below the
-- permits in use, 0 when the total was never set.
local M, H, C, Q, QE = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
purge(M, H, C, Q, QE, now_ms())
return (available(M))
