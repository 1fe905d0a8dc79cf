-- rw_cancel_write: withdraw a writer that stops waiting (rw_common.lua is
-- prepended), so that the readers its waiting mark kept out may proceed.
--
-- KEYS[1..5]  W, RL, RC, WW (see rw_common.lua), and the channel
-- ARGV[1]     the owner ID
-- ARGV[2]     the Client's ID, for the release message
--
-- Returns the message published for whoever can now proceed, or ''.
local W, RL, RC, WW, CH = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
purge(RL, RC, WW, now_ms())
if redis.call('ZREM', WW, ARGV[1]) == 0 then
  return ''
end
local msg = wake_message(ARGV[2], W, RL, WW)
if msg then
  redis.call('PUBLISH', CH, msg)
end
return msg or ''
