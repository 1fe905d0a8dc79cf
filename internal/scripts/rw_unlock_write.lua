-- rw_unlock_write: drop one write hold of an RWMutex (includes
-- rw_common.lua). The last one releases the write lock, to every reader
-- queued, else to the first writer queued (see rw_common.lua).
--
-- KEYS[1..7]  W, RL, RC, Q, QE, F (see rw_common.lua), and the channel
-- ARGV[1]     the owner ID
-- ARGV[2]     the Client's ID, for a grant message
--
-- Returns {-1, ''} when the owner does not write (nothing changes), {n, ''}
-- when it has n write holds left, or {0, owners, token}: released, handed to
-- the owners listed (comma-separated, '' for none), with the writer's token
-- (or '').
--#include rw_common.lua
local W, RL, RC, Q, QE, F, CH = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local owner, from = ARGV[1], ARGV[2]
local v, bad = rw_open(W, RL, RC, Q, QE, 'o', 'f')
if bad then
  return bad
end
if v[2] ~= owner then
  return {-1, ''}
end
local n = redis.call('HINCRBY', W, 'n', -1)
if n > 0 then
  return {n, ''}
end
free_writer(W)
local now = now_ms()
purge(RL, RC, Q, QE, now)
local to, f, ttl = admit(true, W, F, RL, RC, Q, QE, CH, from, now, v[3])
return {0, to, f, ttl}
