-- excl_force: release an exclusive lock whoever holds it, as its holder's
-- last release would: to the first live waiter if any, else free.
--
-- KEYS[1..6]  K, Q, QE, F, RL (see excl_common.lua), and the channel
-- ARGV[1]     the kind
-- ARGV[2]     the Client's ID, for a grant message
-- ARGV[3]     '1' for a counted kind, else '0' (unused: every kind is
--             handed over alike)
--
-- Returns {0, ''} when the lock was free (nothing changes), {1, ''} when it
-- was released and is now free, or {1, id, token} when it went on to the
-- waiter id. Keys of another kind fail with DLOCK_KIND before anything
-- changes.
--#include excl_common.lua
local K, Q, QE, F, CH = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[6]
local kind, from = ARGV[1], ARGV[2]
local v, bad = main_key(K, kind, 'o', 'f')
if bad then
  return bad
end
if not v[2] then
  return {0, ''}
end
return pass_on_reply(1, K, F, kind, Q, QE, CH, from, v[3])
