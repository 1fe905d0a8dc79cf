-- rw_unlock_write: drop a write hold of an RWMutex if, and only if, the
-- grant holds it (includes rw_common.lua). The last one releases the write
-- lock, to every reader queued, else to the first writer queued (see
-- rw_common.lua). It takes and returns what excl_unlock.lua does, so that
-- the write side runs on the exclusive locks' engine.
--
-- KEYS[1..7]  W, RL, RC, Q, QE, F (see rw_common.lua), and the channel
-- ARGV[1]     the kind, as the engine sends it (unused: W's is 'rwlock')
-- ARGV[2]     the grant ID
-- ARGV[3]     the Client's ID, for a grant message
-- ARGV[4]     '1': drop one hold; '0': release whatever the count (the
--             Client's count decides the last Unlock: see engine's
--             Reentrant)
-- ARGV[5..]   only at the end of a cohort (WithCohort): the waiting mark
--             lease in ms, the number n of waiters then listed to drop
--             from the queue first, whether or not the grant still holds
--             the lock (the places of the writers the cohort served
--             locally), and after them the writers to queue, in this order,
--             before the lock passes on (the cohort's local waiters)
--
-- Returns {-1, ''} when the grant does not hold the write lock (nothing
-- changes), {n, ''} when it has n holds left, the integer 0 (the fast
-- path's shorter reply) or {0, ''} when the lock was freed, or {0, owners,
-- token, ttl}: handed to the owners listed (comma-separated: readers, or
-- one writer's grant), with the writer's token (or '') and the lease they
-- got in ms.
local W, RL, RC, Q, QE, F, CH = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local id, from, counted = ARGV[2], ARGV[3], ARGV[4] == '1'
-- The fast paths, before any helper is defined (see scripts.go): the
-- grant's last write hold, no cohort lists, no reader holding (RL empty)
-- and no reader queued. Then the lock goes to the first writer queued if
-- its mark is live, as admit does after a writer (grant_writer, take_write,
-- issue_fence), or is freed when nobody is queued (free_writer); in 7-12
-- calls instead of 14 or more. Marks expired behind the first writer stay
-- for the next slow path to purge (Q's and QE's expiry covers them).
-- Anything else (a reader queued, a dead first mark, any of the five keys
-- of another type, which the slow path names) goes down the slow path.
local v = redis.pcall('HMGET', W, 'k', 'o', 'n', 'f', 'x') -- a W of another type: slow path
if v[1] == 'rwlock' and v[2] == id and (not counted or tonumber(v[3] or '1') <= 1) and v[4] and #ARGV < 5 then
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
    redis.call('HDEL', W, 'o', 'n', 'q')
    redis.call('PEXPIRE', W, '60000') -- fence_memory
    return 0
  end
  local expiry = first and redis.call('ZSCORE', QE, first)
  local t = expiry and redis.call('TIME')
  local ttl = t and tonumber(expiry) - (tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
  if ttl and ttl > 0 then
    local colon = string.find(first, ':', 1, true)
    local head, to = string.sub(first, 1, colon - 1), string.sub(first, colon + 2)
    local plus = string.find(head, '+', 1, true)
    local reserve = plus and tonumber(string.sub(head, plus + 1)) or 0
    local lease = tonumber(plus and string.sub(head, 1, plus - 1) or head)
    if lease and lease > 0 and lease < ttl then
      ttl = lease
    end
    local f = tonumber(v[4]) + (tonumber(v[5]) or 0) + 1
    local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
    if now > f then
      f = now
    end
    local fs = string.format('%.0f', f)
    redis.call('ZREM', Q, first)
    redis.call('ZREM', QE, first)
    if reserve > 0 then
      redis.call('SET', F, fs .. '+' .. reserve, 'PX', '60000')
      redis.call('HSET', W, 'o', to, 'n', 1, 'f', fs, 'q', '1', 'x', reserve)
    else
      redis.call('SET', F, fs, 'PX', '60000')
      redis.call('HSET', W, 'o', to, 'n', 1, 'f', fs, 'q', '1')
      redis.call('HDEL', W, 'x')
    end
    redis.call('PEXPIRE', W, ttl)
    if string.match(to, '^[^.]*') ~= from then
      redis.call('PUBLISH', CH, from .. '|1|g|' .. to .. '|' .. fs .. '|' .. ttl)
    end
    return {0, to, fs, ttl}
  end
end
--#include rw_common.lua
--#include cohort_end.lua
local bad
v, bad = rw_open(W, RL, RC, Q, QE, 'o', 'f')
if bad then
  return bad
end
local enqueue = drop_served(Q, QE)
if v[2] ~= id then
  return {-1, ''}
end
local now = now_ms()
queue_local(Q, QE, enqueue)
if counted then
  local n = redis.call('HINCRBY', W, 'n', -1)
  if n > 0 then
    return {n, ''}
  end
end
free_writer(W)
purge(RL, RC, Q, QE, now)
local to, f, ttl = admit(true, W, F, RL, RC, Q, QE, CH, from, now, v[3])
return {0, to, f, ttl}
