-- sem_delete: delete a semaphore, total, permits and queue (includes
-- sem_common.lua), and wake every waiter to see it gone.
--
-- KEYS[1..6]  M, H, C, Q, QE (see sem_common.lua), and the channel
-- ARGV[1]     the Client's ID, for the release message
--
-- Returns 1 when there was anything to delete, else 0. Keys of another kind
-- fail with DLOCK_KIND before anything changes.
--#include sem_common.lua
local M, H, C, Q, QE, CH = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local _, bad = sem_state(M, H, C, Q, QE)
if bad then
  return bad
end
local n = redis.call('DEL', M, H, C, Q, QE)
if n > 0 then
  redis.call('PUBLISH', CH, msg_wake(ARGV[1], 0))
  return 1
end
return 0
