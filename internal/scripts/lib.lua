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
-- covers a clock that steps back (see docs/design.md, "Fencing tokens").
-- Returned as a decimal string: Lua would print a 16-digit number in
-- exponent form.
local function next_fence(stored)
  local f = tonumber(stored or '0') + 1
  local t = now_us()
  if t > f then
    f = t
  end
  return string.format('%.0f', f)
end

-- Token memory of the lock kinds (Mutex, ReentrantMutex, Election, an
-- RWMutex's writers), which issue a name's tokens from one sequence. Every
-- grant writes the token it issued to F = p{n}:f, as '<token>' or, with
-- tokens reserved after it, '<token>+<reserved>', expiring fence_memory ms
-- later. A grant reads F when the main key holds no token: it expired with
-- a crashed holder's lease, or a lock of another kind took the name over.
-- So every token is above every token issued in the fence_memory before
-- it, whatever the server's clock did meanwhile, and above earlier ones as
-- long as the clock never steps back by fence_memory or more.
local fence_memory = '60000' -- a string: Redis formats numbers with printf

-- The highest token issued or reserved that F remembers, or 0.
local function remembered_fence(F)
  local m = redis.call('GET', F)
  if not m then
    return 0
  end
  local plus = string.find(m, '+', 1, true)
  if plus then
    return (tonumber(string.sub(m, 1, plus - 1)) or 0) + (tonumber(string.sub(m, plus + 1)) or 0)
  end
  return tonumber(m) or 0
end

-- Issue the next token after last (a number: the highest token issued or
-- reserved for the name that the main key knows of; nil: ask F), with
-- reserve (> 0) more reserved after it, and remember it in F. Returns it
-- as a decimal string.
local function issue_fence(F, last, reserve)
  local f = (last or remembered_fence(F)) + 1
  local t = now_us()
  if t > f then
    f = t
  end
  local fs = string.format('%.0f', f)
  if reserve and reserve > 0 then
    redis.call('SET', F, fs .. '+' .. reserve, 'PX', fence_memory)
  else
    redis.call('SET', F, fs, 'PX', fence_memory)
  end
  return fs
end

-- The highest token a lock's main key K knows of: its token f (a string,
-- or nil when it holds none) and the reservation K keeps after it; nil
-- when it holds none, so that issue_fence asks F.
local function known_fence(K, f)
  if not f then
    return nil
  end
  return tonumber(f) + (tonumber(redis.call('HGET', K, 'x')) or 0)
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

-- The lock kinds: once released, their main key holds only the lock's
-- kind and token memory, and a lock of another of these kinds may take the
-- name over (take_over).
local lock_kinds = {mutex = true, reentrant_mutex = true, election = true, rwlock = true}

-- take_over lets an acquiring script of a lock kind take a name whose main
-- key K holds a released lock of another lock kind: no holder ('o'), no
-- queue hint ('q'; an RWMutex's W may keep one that a release of an earlier
-- version left, which means nothing without a writer), nobody queued in Q
-- and no reader in RL (nil: none to look at). It deletes K and returns the
-- highest token K remembered (a number), which the caller's grant must go
-- above; nil when K is anything else, which the caller refuses as main_key
-- does.
local function take_over(K, Q, RL)
  local v = redis.pcall('HMGET', K, 'k', 'o', 'q', 'f', 'x')
  if v.err or not lock_kinds[v[1]] or v[2] or v[3] and v[1] ~= 'rwlock' then
    return nil
  end
  if redis.call('EXISTS', Q) == 1 or RL and redis.call('EXISTS', RL) == 1 then
    return nil
  end
  redis.call('DEL', K)
  return (tonumber(v[4] or '0') or 0) + (tonumber(v[5]) or 0)
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

-- Replies of the acquiring scripts (excl_try, rw_try_*, sem_try, sem_drain):
-- the Lua side of internal/wire's try.go, which reads them. held: the caller
-- holds, count times (its hold count; a drain's permits), with the fencing
-- token of its hold ('' for a read hold, which has none). busy: refused;
-- ms is what the blocking lease has left (an expiry in ms from now, or a
-- PTTL; nil or negative for none known), holder and token whose hold
-- blocks ('' when none), queued 1 when this try queued the caller anew, and
-- flags a primitive's own ('' when none: see try.go).
local function held(count, token)
  return {1, count, token}
end

local function busy(ms, holder, token, queued, flags)
  local left = 0
  if ms ~= nil and ms >= 0 then
    left = math.max(ms, 1) -- PTTL says 0 in its last millisecond
  end
  return {0, left, holder or '', token or '', queued, flags or ''}
end

-- Lengthen key's expiry to at least ms; a key without one gets one.
local function extend(key, ms)
  if redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, ms)
  end
end

-- Waiter names: the Lua side of internal/wire's waiter.go, which states
-- the formats. An exclusive lock's waiter '<lease>[+<reserve>]:<id>' reads
-- as its lease (ms), its ID and its reservation (0 when none); an
-- RWMutex's '<lease>[+<reserve>]:<r|w><id>' as its lease, its role ('r' or
-- 'w'), a reader's owner or a writer's grant ID, and its reservation.
local function parse_waiter(w)
  local colon = string.find(w, ':', 1, true)
  local head = string.sub(w, 1, colon - 1)
  local reserve = 0
  local plus = string.find(head, '+', 1, true)
  if plus then
    reserve = tonumber(string.sub(head, plus + 1)) or 0
    head = string.sub(head, 1, plus - 1)
  end
  return tonumber(head), string.sub(w, colon + 1), reserve
end

local function parse_rw(w)
  local lease, id, reserve = parse_waiter(w)
  return lease, string.sub(id, 1, 1), string.sub(id, 2), reserve
end

-- Release messages. internal/wire's release.go owns the format,
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

-- kind 'x': the hold of the holder ID listed was released (a Redlock
-- master's release: its waiters count the masters that said so), or, with
-- its token, taken away by a ForceUnlock (excl_force: its Client, if it
-- still believes it holds, learns of the loss at once).
local function msg_released(from, id, fence)
  if fence then
    return from .. '|1|x|' .. id .. '|' .. fence
  end
  return from .. '|1|x|' .. id
end

-- The Client a holder or waiter ID belongs to: IDs start with it and a dot.
local function client_of(id)
  return string.match(id, '^[^.]*')
end
