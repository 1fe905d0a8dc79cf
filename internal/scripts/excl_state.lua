-- excl_state: what an exclusive lock looks like now, for inspection.
--
-- KEYS[1..3]  K, Q, QE (see excl_common.lua)
-- ARGV[1]     the kind
--
-- Returns {holder ID or '', ms its lease has left (0 when free), hold count,
-- fencing token of the current or last hold or '', live waiters queued}.
-- Keys of another kind fail with DLOCK_KIND. It changes nothing.
--#include excl_common.lua
local K, Q, QE = KEYS[1], KEYS[2], KEYS[3]
local v, bad = excl_open(K, ARGV[1], Q, QE, 'o', 'n', 'f')
if bad then
  return bad
end
local holder, left = v[2] or '', 0
if v[2] then
  left = math.max(redis.call('PTTL', K), 0)
end
local waiting = redis.call('ZCOUNT', QE, '(' .. now_ms(), '+inf')
return {holder, left, tonumber(v[3] or '0'), v[4] or '', waiting}
