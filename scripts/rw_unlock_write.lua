-- rw_unlock_write: drop one write hold (rw_common.lua is prepended).
--
-- KEYS[1..5]  W, RL, RC, WW (see rw_common.lua), and the channel
-- ARGV[1]     the owner ID
-- ARGV[2]     the releasing Client's ID, for the release message
--
-- Returns {remaining write holds of the owner, message}: -1 when the owner
-- does not write (then nothing changes). When the write lock is released,
-- the message for whoever can proceed (one writer, all readers, or all) is
-- published and returned; else ''.
local W, RL, RC, WW, CH = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local owner = ARGV[1]
purge(RL, RC, WW, now_ms())
if redis.call('HEXISTS', W, owner) == 0 then
  return {-1, ''}
end
local n = redis.call('HINCRBY', W, owner, -1)
if n > 0 then
  return {n, ''}
end
redis.call('DEL', W)
local msg = wake_message(ARGV[2], W, RL, WW)
if msg then
  redis.call('PUBLISH', CH, msg)
end
return {0, msg or ''}
