-- excl_try: take an exclusive lock, claim or re-enter it, or join its queue.
--
-- KEYS[1..6]  K, Q, QE, F, RL (see excl_common.lua), and the channel
-- ARGV[1]     the kind ('mutex', 'reentrant_mutex', 'election')
-- ARGV[2]     the caller as a waiter: '<lease>[+<reserve>]:<id>' (see
--             internal/wire's waiter.go)
-- ARGV[3]     the lease to apply in ms
-- ARGV[4]     waiting mark lease in ms; 0 for a try that will not wait
-- ARGV[5]     the Client's ID, for a grant message
-- ARGV[6]     '1' for a counted kind (re-entry adds a hold), else '0'
-- ARGV[7]     the waiter's ID, and
-- ARGV[8]     its reservation ('0' for none), as ARGV[2] has them: the
--             caller sends them apart so that the hot path parses nothing
-- ARGV[9]     counted kinds: the holds the caller's Client has recorded for
--             the owner (absent: 0). A hold of the owner that its Client
--             has not recorded is a hand-over it has not taken yet (or one
--             it forgot as lost): the try claims it, count 1, rather than
--             re-entering it.
--
-- Returns held(count, token) (lib.lua) when the caller holds the lock:
-- count is its hold count (1 for a new hold), token the hold's fencing
-- token; the hot path answers a new hold with the token alone, a string
-- standing for held(1, token) (a shorter reply costs the server less), and
-- only for a lock nobody had queued for since it was last free (no q). It
-- was free with nobody live queued ahead (a new token is issued), or a
-- release had handed it to the caller (then the lease is reset to ARGV[3]),
-- or the caller holds it already (counted, with ARGV[9] > 0: count + 1,
-- lease unchanged; else a claim: count 1, the lease reset). Otherwise returns busy(ms the holder's lease has
-- left, the holder's ID, its token, 1 when this try queued the caller anew
-- (it was not queued before) else 0) and, if ARGV[4] > 0, queues the caller
-- (once) with its mark set to expire ARGV[4] ms from now. The first caller
-- so queued since a grant of the hot path (no queue hint) on a lock whose
-- grants reserve tokens (a cohort's) publishes '<from>|0|q', unless it is
-- a cohorting waiter (ARGV[8] > 0) of the holder's own Client: those set
-- the hint to 'c', which the first other caller still announces. A free
-- lock with others queued goes to the first of them, as a release would; it is then
-- the holder returned. A released lock of another lock kind is taken over
-- (take_over, lib.lua). Keys of another kind fail with DLOCK_KIND (a K of
-- another type with WRONGTYPE) before anything changes.
local K, Q, QE, F, RL, CH = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local kind, waiter, ttl, id, xs = ARGV[1], ARGV[2], ARGV[3], ARGV[7], ARGV[8]
local reserve = tonumber(xs)
-- The hot path, before any helper is defined (see scripts.go): a lock of
-- this kind, free, nobody queued (no queue hint q), its token known. The
-- token is issue_fence's (lib.lua), after any reservation (excl_common.lua),
-- and is remembered in F as issue_fence does. Without
-- one it is worked out on decimal strings: tokens have no leading zeros, so
-- the longer string, or at equal length the greater one, is the greater
-- number, and the usual case (the clock ahead of the last token) takes no
-- conversion to or from a number. Redis formats numbers with printf, a
-- visible cost here: a Lock that reserves tokens stores the count it got
-- in ARGV[8] as it came, never a number it formatted.
-- HMGET runs unprotected (redis.pcall costs more): a K of another type
-- fails the script with WRONGTYPE there, before anything changes.
local v = redis.call('HMGET', K, 'k', 'o', 'n', 'f', 'x', 'q')
if v[1] == kind and not v[2] and not v[6] and v[4] then
  local base, x = v[4], v[5]
  local t = redis.call('TIME')
  local fs = t[1] .. string.rep('0', 6 - #t[2]) .. t[2]
  if x or not (#fs > #base or #fs == #base and fs > base) then
    local last = tonumber(base) + (tonumber(x) or 0)
    if tonumber(fs) <= last then
      fs = string.format('%.0f', last + 1)
    end
  end
  if reserve > 0 then
    redis.call('HSET', K, 'o', id, 'n', '1', 'f', fs, 'x', xs)
    redis.call('PEXPIRE', K, ttl)
    redis.call('SET', F, fs .. '+' .. xs, 'PX', '60000') -- fence_memory
  else
    redis.call('HSET', K, 'o', id, 'n', '1', 'f', fs)
    redis.call('PEXPIRE', K, ttl)
    redis.call('SET', F, fs, 'PX', '60000')
  end
  return fs
end
--#include excl_common.lua
--#include queue_hint.lua
-- Whether a grant reserved tokens (x: a cohort may hold the lock), and the
-- queue hint, as the hot path read them.
local reserving, hint = v[5], v[6]
local mark, from = tonumber(ARGV[4]), ARGV[5]
local counted = ARGV[6] == '1'
local bad
v, bad = main_key(K, kind, 'o', 'n', 'f')
local carried -- the token memory of a released lock of another kind
if bad then
  carried = take_over(K, Q, RL)
  if not carried then
    return bad
  end
  v = {}
end
local holder, fence = v[2], v[4]
-- The highest token issued or reserved for the name that K knows of.
local function last()
  return carried or known_fence(K, fence)
end
if holder == id then
  if counted and tonumber(ARGV[9] or '0') > 0 then
    return held(redis.call('HINCRBY', K, 'n', 1), fence)
  end
  redis.call('HSET', K, 'n', 1) -- a hand-over claimed
  redis.call('PEXPIRE', K, ttl)
  return held(1, fence)
end
if not holder and redis.call('EXISTS', Q) == 0 then
  return held(1, take(K, F, kind, id, ttl, last(), 1, reserve))
end
bad = queue_keys(Q, QE)
if bad then
  return bad
end
local s, us = now_parts()
local now = s * 1000 + math.floor(us / 1000)
purge(Q, QE, now)
if not holder then
  local first = redis.call('ZRANGE', Q, 0, 0)[1]
  if first and first ~= waiter then
    local to, f = grant_first(K, F, kind, Q, QE, CH, from, now, last())
    if to then
      holder, fence, hint = to, f, '1'
    end
  end
  if not holder then
    redis.call('ZREM', Q, waiter)
    redis.call('ZREM', QE, waiter)
    return held(1, take(K, F, kind, id, ttl, last(), 1, reserve))
  end
end
local added = 0
if mark > 0 then
  added = redis.call('ZADD', Q, 'NX', string.format('%d%06d', s, us), waiter)
  redis.call('ZADD', QE, now + mark, waiter)
  extend(Q, mark)
  extend(QE, mark)
  -- (take sets the hint to '1': a grant it makes is not quiet.)
  note_queued(K, CH, from, holder, hint, reserving, added, reserve > 0 and client_of(holder) == from)
end
return busy(redis.call('PTTL', K), holder, fence, added)
