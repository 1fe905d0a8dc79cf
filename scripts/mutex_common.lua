-- mutex_common: included by every mutex_*.lua script where it says
-- '--#include mutex_common.lua'; not a script of its own.
--
-- A Mutex named n keeps three keys, all with the hash tag {n}:
--   K   p{n}      string  the holder's token (fresh per acquisition)
--   Q   p{n}:mq   zset    waiter token -> arrival (server microseconds): the queue
--   QE  p{n}:mqe  zset    waiter token -> expiry of its waiting mark (server ms)
-- and publishes on p{n}:ch. K expires by its lease. Q and QE lose members by
-- purge and vanish when empty; their key TTLs cover the latest mark, so
-- crashed waiters leave nothing behind for good.
--
-- Handoff: a release with live waiters queued does not free K. It writes the
-- first waiter's token into K at once, with that waiter's remaining mark as
-- the lease, and publishes "<from>|1|g|<token>": the waiter learns it holds
-- the lock from the message alone, without another round trip. So waiters
-- are served in arrival order, across Clients. Tokens start with the ID of
-- the waiter's Client and a dot; a release that hands the lock to a waiter
-- of its own Client publishes nothing, as that Client wakes it directly.

local function now_parts()
  local t = redis.call('TIME')
  return tonumber(t[1]), tonumber(t[2])
end

local function now_ms()
  local s, us = now_parts()
  return s * 1000 + math.floor(us / 1000)
end

-- Drop the waiters whose mark expired.
local function purge(Q, QE, now)
  local gone = redis.call('ZRANGEBYSCORE', QE, '-inf', now)
  for _, id in ipairs(gone) do
    redis.call('ZREM', Q, id)
  end
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', QE, '-inf', now)
  end
end

-- Make the first live waiter the holder of K (free, or the caller's to give
-- away) and tell it so, unless its token shows it waits on Client from, the
-- caller, which wakes it itself. Returns its token, or nil when nobody waits
-- (then K is unchanged). Call after purge.
local function grant_first(K, Q, QE, CH, from, now)
  while true do
    local first = redis.call('ZRANGE', Q, 0, 0)[1]
    if not first then
      return nil
    end
    redis.call('ZREM', Q, first)
    local expiry = tonumber(redis.call('ZSCORE', QE, first) or '0')
    redis.call('ZREM', QE, first)
    if expiry > now then
      redis.call('SET', K, first, 'PX', expiry - now)
      if string.sub(first, 1, #from + 1) ~= from .. '.' then
        redis.call('PUBLISH', CH, from .. '|1|g|' .. first)
      end
      return first
    end
  end
end

-- The caller gives K up: hand it to the first live waiter, or else free it.
-- Returns what mutex_unlock and mutex_cancel return for a lock they held.
local function pass_on(K, Q, QE, CH, from)
  local now = now_ms()
  purge(Q, QE, now)
  local next = grant_first(K, Q, QE, CH, from, now) -- overwrites K
  if not next then
    redis.call('DEL', K)
  end
  return next or 1
end
