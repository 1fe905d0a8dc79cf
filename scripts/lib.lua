-- lib: helpers every script may use. A script that needs them says
-- '--#include lib.lua' where they must be defined (see scripts.go).

-- The server's clock: seconds and microseconds, or milliseconds.
local function now_parts()
  local t = redis.call('TIME')
  return tonumber(t[1]), tonumber(t[2])
end

local function now_ms()
  local s, us = now_parts()
  return s * 1000 + math.floor(us / 1000)
end

local function now_us()
  local s, us = now_parts()
  return s * 1000000 + us
end

-- Fencing tokens. The next token after stored (the last one issued for the
-- name, a decimal string, or nil when none is known): the server's clock in
-- microseconds, or stored + 1 when that is not greater. Tokens therefore
-- grow with the clock across data loss and key expiry, and the stored value
-- covers a clock that steps back (see the README's Fencing section). Returned
-- as a decimal string: Lua would print a 16-digit number in exponent form.
local function next_fence(stored)
  local f = tonumber(stored or '0') + 1
  local t = now_us()
  if t > f then
    f = t
  end
  return string.format('%.0f', f)
end

-- Keys that are not what a primitive expects. Every check runs before the
-- script writes anything, and returns an error reply for the script to
-- return: 'DLOCK_KIND <key> <what it holds>' (errors.go reads it).
local function foreign(key, found)
  return redis.error_reply('DLOCK_KIND ' .. key .. ' ' .. found)
end

-- 'a <what>' or 'an <what>'.
local function a(what)
  if string.find(what, '^[aeiou]') then
    return 'an ' .. what
  end
  return 'a ' .. what
end

-- The main key of a primitive is a hash whose field 'k' names its kind.
-- main_key returns the values of the fields asked for (HMGET, after 'k'),
-- or nil and an error reply when K holds anything but nothing or a
-- primitive of this kind.
local function main_key(K, kind, ...)
  local v = redis.pcall('HMGET', K, 'k', ...)
  if v.err then
    return nil, foreign(K, redis.call('TYPE', K)['ok'])
  end
  if v[1] ~= kind then
    if v[1] then
      return nil, foreign(K, a(v[1]))
    end
    if redis.call('EXISTS', K) == 1 then
      return nil, foreign(K, 'a hash of another program')
    end
  end
  return v
end

-- An error reply when an auxiliary key exists with another type than typ.
local function aux_key(key, typ)
  local t = redis.call('TYPE', key)['ok']
  if t ~= 'none' and t ~= typ then
    return foreign(key, a(t))
  end
end

-- Remove from zset Z the members whose score, an expiry in server
-- milliseconds, is not after now, and return them.
local function take_expired(Z, now)
  local gone = redis.call('ZRANGEBYSCORE', Z, '-inf', now)
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', Z, '-inf', now)
  end
  return gone
end

-- How a refused try reports the time a blocking lease has left, for the
-- caller's fallback timer: ms (an expiry in ms from now, or a PTTL) as a
-- negative number, at least 1 for a lease about to end (PTTL says 0 in its
-- last millisecond), and 0 only for no expiry at all.
local function refusal(ms)
  if ms == nil or ms < 0 then
    return 0
  end
  return -math.max(ms, 1)
end

-- Lengthen key's expiry to at least ms; a key without one gets one.
local function extend(key, ms)
  if redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, ms)
  end
end

-- Release messages. protocol.go owns the format,
-- "from|n|kind|ids|fence|ttl": from is the releasing Client's ID; then n
-- waiters (0: all) of one kind ('' any, 'r' readers, 'w' writers, 'o' an
-- Election's observers, which only their own kind wakes) to wake, or the
-- IDs of the waiters to wake; kind 'g' says the lock was handed to the
-- holder IDs listed, with the fencing token fence and a lease of ttl ms.
local function msg_wake(from, n, kind)
  return from .. '|' .. n .. '|' .. (kind or '')
end

local function msg_ids(from, ids)
  return from .. '|0||' .. table.concat(ids, ',')
end

local function msg_handed(from, id, fence, ttl)
  return from .. '|1|g|' .. id .. '|' .. fence .. '|' .. ttl
end

-- The Client a holder or waiter ID belongs to: IDs start with it and a dot.
local function client_of(id)
  return string.match(id, '^[^.]*')
end
