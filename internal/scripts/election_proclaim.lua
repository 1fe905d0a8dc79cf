-- election_proclaim: the leader of an election publishes its value (the
-- Election's kind of exclusive lock, see excl_common.lua and election.go).
--
-- KEYS[1..3]  K, Q (see excl_common.lua), and the channel
-- ARGV[1]     the holder's ID
-- ARGV[2]     its value
-- ARGV[3]     the Client's ID, for the notice
--
-- The value is kept in K's field 'v:<id>', so it lives and expires with the
-- lock; values of campaigners that neither lead nor are queued are removed.
-- Observers are told by a notice '<from>|0|o' (protocol.go). Returns 1 when
-- ARGV[1] leads, else 0 (then nothing changes). Keys of another kind fail
-- with DLOCK_KIND.
--#include excl_common.lua
local K, Q, CH = KEYS[1], KEYS[2], KEYS[3]
local id, value, from = ARGV[1], ARGV[2], ARGV[3]
local v, bad = main_key(K, 'election', 'o')
if bad then
  return bad
end
if v[2] ~= id then
  return 0
end
local queued = {}
for _, w in ipairs(redis.call('ZRANGE', Q, 0, -1)) do
  local _, wid = parse_waiter(w)
  queued['v:' .. wid] = true
end
for _, f in ipairs(redis.call('HKEYS', K)) do
  if string.sub(f, 1, 2) == 'v:' and not queued[f] then
    redis.call('HDEL', K, f)
  end
end
redis.call('HSET', K, 'v:' .. id, value)
redis.call('PUBLISH', CH, msg_wake(from, 0, 'o'))
return 1
