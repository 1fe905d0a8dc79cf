-- rw_cancel: a waiter of an RWMutex stops waiting (includes rw_common.lua).
-- It leaves the queue; a hand-over it has not claimed is given up as a
-- release would give it up; and whoever its leaving lets in is let in. It
-- takes what excl_cancel.lua does, so that the write side runs on the
-- exclusive locks' engine; readers call it the same way.
--
-- KEYS[1..7]  W, RL, RC, Q, QE, F (see rw_common.lua), and the channel
-- ARGV[1]     the kind, as the engine sends it (unused)
-- ARGV[2]     the waiter: '<lease>[+<reserve>]:<r|w><ID>'
-- ARGV[3]     the Client's ID, for a grant message
-- ARGV[4]     unused (excl_cancel's counted flag: a writer's hand-over is
--             given up by ARGV[5] alone)
-- ARGV[5]     a writer: the write holds its Client has recorded for the
--             grant (absent: 0); a write hold of the grant that its Client
--             has not recorded is a hand-over nobody took, given up here
--
-- Returns {0, owners, token, ttl}: the owners the lock went to ('' for
-- none), with the writer's token (or '') and their lease in ms. (Unlike
-- excl_cancel, it answers 0 after giving a hand-over up too: no caller
-- reads the code.)
--#include rw_common.lua
local W, RL, RC, Q, QE, F, CH = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local waiter, from = ARGV[2], ARGV[3]
local _, role, owner = parse_rw(waiter)
local v, bad = rw_open(W, RL, RC, Q, QE, 'o', 'n', 'f')
if bad then
  return bad
end
redis.call('ZREM', Q, waiter)
redis.call('ZREM', QE, waiter)
local after_writer = false
if role == 'w' and v[2] == owner and tonumber(ARGV[5] or '0') == 0 then
  free_writer(W) -- handed, never taken
  after_writer = true
elseif role == 'r' and redis.call('HGET', RC, owner) == '0' then
  redis.call('HDEL', RC, owner)
  redis.call('ZREM', RL, owner)
end
local now = now_ms()
purge(RL, RC, Q, QE, now)
local to, f, ttl = admit(after_writer, W, F, RL, RC, Q, QE, CH, from, now, v[4])
return {0, to, f, ttl}
