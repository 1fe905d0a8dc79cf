-- latch_delete: delete a latch, and wake every waiter (includes
-- latch_common.lua): a deleted latch is at zero.
--
-- KEYS[1]  the latch key (see latch_common.lua)
-- KEYS[2]  the latch's channel
-- ARGV[1]  the Client's ID, for the release message
--
-- Returns 1 when there was a latch to delete, else 0. A key of another kind
-- fails with DLOCK_KIND and is left untouched.
--#include latch_common.lua
local _, bad = latch_state(KEYS[1])
if bad then
  return bad
end
if redis.call('DEL', KEYS[1]) == 1 then
  redis.call('PUBLISH', KEYS[2], msg_wake(ARGV[1], 0))
  return 1
end
return 0
