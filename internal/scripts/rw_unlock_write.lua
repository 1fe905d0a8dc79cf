-- rw_unlock_write: drop one write hold of an RWMutex (includes
-- rw_common.lua). The last one releases the write lock, to every reader
-- queued, else to the first writer queued (see rw_common.lua).
--
-- KEYS[1..7]  W, RL, RC, Q, QE, F (see rw_common.lua), and the channel
-- ARGV[1]     the owner ID
-- ARGV[2]     the Client's ID, for a grant message
--
-- Returns {-1, ''} when the owner does not write (nothing changes), {n, ''}
-- when it has n write holds left, or {0, owners, token, ttl}: released,
-- handed to the owners listed (comma-separated, '' for none), with the
-- writer's token (or '') and the lease they got in ms (0: none).
local W, RL, RC, Q, QE, F, CH = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local owner, from = ARGV[1], ARGV[2]
-- The fast paths, before any helper is defined (see scripts.go): the
-- owner's last write hold, no reader holding (RL empty) and no reader
-- queued. Then the lock goes to the first writer queued if its mark is
-- live, as admit does after a writer (grant_writer, issue_fence), or is
-- freed when nobody is queued (free_writer); in 7-12 calls instead of 14 or
-- more. Marks expired behind the first writer stay for the next slow path
-- to purge (Q's and QE's expiry covers them). Anything else (a reader
-- queued, a dead first mark, any of the five keys of another type, which
-- the slow path names) goes down the slow path.
local v = redis.pcall('HMGET', W, 'k', 'o', 'n', 'f') -- a W of another type: slow path
if v[1] == 'rwlock' and v[2] == owner and tonumber(v[3] or '1') <= 1 and v[4] then
  local q = redis.pcall('ZRANGE', Q, 0, -1)
  local readers = redis.pcall('ZCARD', RL)
  local rc, qe = redis.call('TYPE', RC).ok, redis.call('TYPE', QE).ok
  local first
  if not q.err and readers == 0 and (rc == 'none' or rc == 'hash') and (qe == 'none' or qe == 'zset') then
    first = q[1] or false
    for i = 1, #q do
      local colon = string.find(q[i], ':', 1, true)
      if not colon or string.sub(q[i], colon + 1, colon + 1) ~= 'w' then
        first = nil -- a reader queued: every reader goes first (slow path)
        break
      end
    end
  end
  if first == false then -- nobody queued: free_writer
    redis.call('HDEL', W, 'o', 'n')
    redis.call('PEXPIRE', W, '60000') -- fence_memory
    return {0, '', '', 0}
  end
  local expiry = first and redis.call('ZSCORE', QE, first)
  local t = expiry and redis.call('TIME')
  local ttl = t and tonumber(expiry) - (tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
  if ttl and ttl > 0 then
    local colon = string.find(first, ':', 1, true)
    local lease, to = tonumber(string.sub(first, 1, colon - 1)), string.sub(first, colon + 2)
    if lease and lease > 0 and lease < ttl then
      ttl = lease
    end
    local f = tonumber(v[4]) + 1
    local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
    if now > f then
      f = now
    end
    local fs = string.format('%.0f', f)
    redis.call('ZREM', Q, first)
    redis.call('ZREM', QE, first)
    redis.call('SET', F, fs, 'PX', '60000')
    redis.call('HSET', W, 'o', to, 'n', 1, 'f', fs)
    redis.call('PEXPIRE', W, ttl)
    if string.match(to, '^[^.]*') ~= from then
      redis.call('PUBLISH', CH, from .. '|1|g|' .. to .. '|' .. fs .. '|' .. ttl)
    end
    return {0, to, fs, ttl}
  end
end
--#include rw_common.lua
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
