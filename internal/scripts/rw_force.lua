-- rw_force: release an RWMutex whoever holds it, writer and readers alike,
-- and let in whoever is queued, as a writer's release would (includes
-- rw_common.lua).
--
-- KEYS[1..7]  W, RL, RC, Q, QE, F (see rw_common.lua), and the channel
-- ARGV[1]     the Client's ID, for a grant message
--
-- Returns {1 when anyone held it else 0, owners handed to or '', the token
-- of a writer handed to or '', the lease handed over in ms}. Keys of
-- another kind fail with DLOCK_KIND before anything changes. A writer's
-- release publishes, before any grant message, msg_released(from, grant,
-- token), as excl_force does: the writer's Client, if subscribed, reports
-- the hold lost at once, before anyone it could hand the lock to locally
-- holds (see the engine's forceNotice).
--#include rw_common.lua
local W, RL, RC, Q, QE, F, CH = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local v, bad = rw_open(W, RL, RC, Q, QE, 'o', 'f')
if bad then
  return bad
end
local now = now_ms()
purge(RL, RC, Q, QE, now)
local held = 0
if v[2] or redis.call('ZCARD', RL) > 0 then
  held = 1
end
if v[2] then
  redis.call('PUBLISH', CH, msg_released(ARGV[1], v[2], v[3]))
  free_writer(W)
end
redis.call('DEL', RL, RC)
local to, f, ttl = admit(true, W, F, RL, RC, Q, QE, CH, ARGV[1], now, v[3])
return {held, to, f, ttl}
