-- excl_unlock: drop a hold of an exclusive lock if, and only if, the caller
-- holds it; the last one releases the lock, to the first live waiter if
-- any (see excl_common.lua).
--
-- KEYS[1..6]  K, Q, QE, F, RL (see excl_common.lua), and the channel
-- ARGV[1]     the kind
-- ARGV[2]     the holder's ID
-- ARGV[3]     the Client's ID, for a grant message
-- ARGV[4]     '1' for a counted kind, else '0'
-- ARGV[5..]   only for a Mutex WithCohort: the waiting mark lease in ms, the
--             number n of waiters then listed to drop from the queue first,
--             whether or not the caller still holds the lock (the places of
--             the waiters the cohort served locally), and after them the
--             waiters to queue, in this order, before the lock passes on (the
--             cohort's local waiters, which had no place in the queue)
--
-- Returns {-1, ''} when the caller does not hold the lock (nothing changes),
-- {n, ''} when a counted holder has n holds left, {0, ''} or the integer 0
-- (the hot path's shorter reply) when the lock was freed, or
-- {0, id, token, ttl} when it was handed to the waiter id with the fencing
-- token token and a lease of ttl ms (published unless that waiter is on
-- Client ARGV[3]).
-- Keys of another kind fail with DLOCK_KIND (a K of another type with
-- WRONGTYPE) before anything changes.
local K, Q, QE, F, CH = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[6]
local kind, id, from, counted = ARGV[1], ARGV[2], ARGV[3], ARGV[4] == '1'
-- The hot path, before any helper is defined (see scripts.go): the last
-- hold of the caller, nobody queued (no queue hint q). Freeing keeps the
-- token, as free does (excl_common.lua). As in excl_try, HMGET runs
-- unprotected: a K of another type fails with WRONGTYPE before any change.
local v = redis.call('HMGET', K, 'k', 'o', 'n', 'q', 'f', 'x')
local last = v[1] == kind and v[2] == id and (not counted or tonumber(v[3] or '1') <= 1) and #ARGV < 5
if last and not v[4] then
  redis.call('HDEL', K, 'o', 'n')
  redis.call('PEXPIRE', K, '60000') -- fence_memory
  return 0
end
-- The handoff path, before any helper is defined too: the caller's last
-- hold, and the first waiter in Q has a live mark. It does what pass_on
-- does then (grant_first, take and issue_fence in excl_common.lua and
-- lib.lua), with the token from K's f and x, in 10 calls instead of 17 and
-- without defining the helpers, except that marks expired behind the
-- first stay for the next slow path to purge (Q's and QE's expiry covers
-- them). Anything else (an expired mark first, nobody queued, a Q or QE of
-- another type, which the slow path names) goes down the slow path.
if last and v[5] then
  local r = redis.pcall('ZRANGE', Q, 0, 0)
  local first = not r.err and r[1]
  local expiry = first and redis.pcall('ZSCORE', QE, first)
  if expiry and type(expiry) == 'table' then
    expiry = nil -- QE of another type
  end
  local t = expiry and redis.call('TIME')
  local ttl = t and tonumber(expiry) - (tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
  if ttl and ttl > 0 then
    local colon = string.find(first, ':', 1, true)
    local head, to = string.sub(first, 1, colon - 1), string.sub(first, colon + 1)
    local plus = string.find(head, '+', 1, true)
    local reserve = plus and tonumber(string.sub(head, plus + 1)) or 0
    local lease = tonumber(plus and string.sub(head, 1, plus - 1) or head)
    if lease > 0 and lease < ttl then
      ttl = lease
    end
    local f = tonumber(v[5]) + (tonumber(v[6]) or 0) + 1
    local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
    if now > f then
      f = now
    end
    local fs = string.format('%.0f', f)
    redis.call('ZREM', Q, first)
    redis.call('ZREM', QE, first)
    if reserve > 0 then
      redis.call('SET', F, fs .. '+' .. reserve, 'PX', '60000')
      redis.call('HSET', K, 'o', to, 'n', 1, 'f', fs, 'q', '1', 'x', reserve)
    else
      redis.call('SET', F, fs, 'PX', '60000')
      redis.call('HSET', K, 'o', to, 'n', 1, 'f', fs, 'q', '1')
    end
    redis.call('PEXPIRE', K, ttl)
    if string.match(to, '^[^.]*') ~= from then
      redis.call('PUBLISH', CH, from .. '|1|g|' .. to .. '|' .. fs .. '|' .. ttl)
    end
    return {0, to, fs, ttl}
  end
end
--#include excl_common.lua
--#include cohort_end.lua
local bad
v, bad = main_key(K, kind, 'o', 'n', 'f')
if bad then
  return bad
end
if #ARGV >= 5 then
  bad = queue_keys(Q, QE)
  if bad then
    return bad
  end
end
local enqueue = drop_served(Q, QE)
if v[2] ~= id then
  return {-1, ''}
end
if queue_local(Q, QE, enqueue) then
  redis.call('HSET', K, 'q', '1')
end
if counted then
  local n = redis.call('HINCRBY', K, 'n', -1)
  if n > 0 then
    return {n, ''}
  end
end
if redis.call('EXISTS', Q) == 0 then
  free(K)
  return {0, ''}
end
return pass_on_reply(0, K, F, kind, Q, QE, CH, from, v[4])
