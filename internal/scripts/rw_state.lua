-- rw_state: what an RWMutex looks like now, for inspection (includes
-- rw_common.lua). It changes nothing.
--
-- KEYS[1..5]  W, RL, RC, Q, QE (see rw_common.lua)
--
-- Returns {writer owner ID or '', ms the writer's lease has left (0 when
-- none), write count, fencing token of the current or last write or '',
-- live readers, live waiters queued}. Keys of another kind fail with
-- DLOCK_KIND.
--#include rw_common.lua
local W, RL, RC, Q, QE = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local v, bad = rw_open(W, RL, RC, Q, QE, 'o', 'n', 'f')
if bad then
  return bad
end
local now = '(' .. now_ms()
local left = 0
if v[2] then
  left = math.max(redis.call('PTTL', W), 0)
end
return {v[2] or '', left, tonumber(v[3] or '0'), v[4] or '',
  redis.call('ZCOUNT', RL, now, '+inf'), redis.call('ZCOUNT', QE, now, '+inf')}
