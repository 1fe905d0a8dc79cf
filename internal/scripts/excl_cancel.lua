-- excl_cancel: a waiter stops waiting. It leaves the queue, and if a
-- release handed it the lock meanwhile and it has not claimed it, the lock
-- passes on as excl_unlock would pass it.
--
-- KEYS[1..6]  K, Q, QE, F, RL (see excl_common.lua), and the channel
-- ARGV[1]     the kind
-- ARGV[2]     the waiter: '<lease>:<id>'
-- ARGV[3]     the Client's ID, for a grant message
-- ARGV[4]     '1' for a counted kind, else '0'
-- ARGV[5]     counted kinds: the holds the caller's Client has recorded for
--             the owner (absent: 0)
--
-- Returns {0, ''} when the waiter held nothing, {1, ''} when it held a
-- hand-over and the lock is now free, or {1, id, token, ttl} when the lock
-- went on to the waiter id (a lease of ttl ms). A counted owner whose
-- Client has recorded a hold (ARGV[5] > 0: it took the hand-over, or
-- another call of the owner did) keeps it; one whose Client has recorded
-- none holds only a hand-over that nobody took, which passes on.
--#include excl_common.lua
local K, Q, QE, F, CH = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[6]
local kind, waiter, from, counted = ARGV[1], ARGV[2], ARGV[3], ARGV[4] == '1'
local _, id = parse_waiter(waiter)
local v, bad = excl_open(K, kind, Q, QE, 'o', 'n', 'f')
if bad then
  return bad
end
redis.call('ZREM', Q, waiter)
redis.call('ZREM', QE, waiter)
if v[2] ~= id or counted and tonumber(ARGV[5] or '0') > 0 then
  return {0, ''}
end
return pass_on_reply(1, K, F, kind, Q, QE, CH, from, v[4])
