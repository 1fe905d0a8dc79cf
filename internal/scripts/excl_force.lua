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
-- changes. A release publishes, before its grant or wake-up message,
-- msg_released(from, holder, token): the holder's Client, if subscribed,
-- reports the hold lost at once, before anyone it could hand the lock to
-- locally holds (see the engine's forcedElsewhere).
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
local bad = queue_keys(KEYS[2], KEYS[3])
if bad then
  return bad
end
redis.call('PUBLISH', CH, msg_released(from, v[2], v[3]))
return pass_on_reply(1, K, F, kind, Q, QE, CH, from, v[3])
