-- renew: extend many watchdog leases in one call. It never re-creates a key
-- or a member, and never gives an expiry to a key that has none.
--
-- KEYS       the keys of the leases, in order (all in one hash slot on Redis
--            Cluster); each lease uses one key, two for kind 'R', three for
--            kind 'P'. None when renew_node.lua runs this script over keys
--            of many slots: the keys then come last in ARGV (see below)
-- ARGV[1]    the new lease in milliseconds
-- ARGV[i+1]  lease i: a one-letter kind followed by an ID
--              'o<id>'     KEYS: a primitive's main key (a hash) whose field
--                          'o', the holder, must be <id>
--              'h<owner>'  KEYS: a hash lock in which field <owner> must exist
--              'z<member>' KEYS: a zset of leases scored by expiry (server
--                          milliseconds); <member> must be there, unexpired
--              'R<id>'     KEYS: a zset as for 'z', and a companion key that
--                          lives as long (an RWMutex's read-count hash, a
--                          queue's arrival order)
--              'P<id>'     KEYS: a zset as for 'z', and two companion keys
--                          (a Semaphore's main key and counts, for a permit;
--                          its queue and main key, for a waiter)
-- With no KEYS: ARGV[1] the lease, ARGV[2] the number n of leases,
-- ARGV[3..n+2] their specs as above, and ARGV[n+3..] their keys.
--
-- Returns an array: element i is 1 when lease i was renewed, 0 when the hold
-- is gone (or a key has another type). One bad key never fails the batch.
-- With no KEYS, element i is -1 when a command on a key of lease i failed:
-- its slot is not served here (moved, migrating, importing), the cluster is
-- down, or the key has another type. The caller then renews that lease
-- again with its keys in KEYS, through the node that serves its slot.
--#include lib.lua
local ttl = tonumber(ARGV[1])
local ttl_arg = ARGV[1] -- as received: Redis would format the number with printf
local now = now_ms()

-- specs[first .. first+n-1] are the leases' specs.
local keys, specs, first, n = KEYS, ARGV, 2, #ARGV - 1
local cross = #KEYS == 0 -- the keys are in ARGV, maybe of many slots
if cross then
  n, first = tonumber(ARGV[2]), 3
  keys = {}
  for i = n + 3, #ARGV do
    keys[#keys + 1] = ARGV[i]
  end
end

-- unsure is set when a command of the lease at hand failed with no KEYS:
-- the server may not hold its key at all.
local unsure = false

-- The reply of the first command on a lease's key, or nil when it is an
-- error: with KEYS, a key of another type (the lease is not held).
local function read(...)
  local r = redis.pcall(...)
  if type(r) == 'table' and r.err then
    unsure = cross
    return nil
  end
  return r
end

-- The reply of any later command. With KEYS, an error fails the call, as
-- redis.call does; with no KEYS, it makes the lease unsure.
local function call(...)
  if not cross then
    return redis.call(...)
  end
  local r = redis.pcall(...)
  if type(r) == 'table' and r.err then
    unsure = true
    return nil
  end
  return r
end

-- Lengthen a key's expiry to at least ttl, if it has one.
local function prolong(key)
  local pttl = call('PTTL', key)
  if pttl and pttl >= 0 and pttl < ttl then
    call('PEXPIRE', key, ttl_arg)
  end
end

local function renew_member(key, member)
  local score = read('ZSCORE', key, member)
  if type(score) ~= 'string' or tonumber(score) <= now then
    return false
  end
  call('ZADD', key, 'XX', now + ttl, member)
  prolong(key)
  return true
end

local out = {}
local k = 1
for i = 1, n do
  local spec = specs[first + i - 1]
  local kind = string.sub(spec, 1, 1)
  local key = keys[k]
  if kind == 'o' and not cross then
    -- The common case, inline: read's and call's wrapping costs a fifth of
    -- a lease's renewal. A WRONGTYPE reply is not the ID, so the lease is
    -- not held, as read has it; a failing PEXPIRE fails the call, as call
    -- does with KEYS.
    if redis.pcall('HGET', key, 'o') == string.sub(spec, 2) then
      redis.call('PEXPIRE', key, ttl_arg)
      out[i] = 1
    else
      out[i] = 0
    end
    k = k + 1
  else
    local id = string.sub(spec, 2)
    local held = false
    unsure = false
    if kind == 'o' then
      held = read('HGET', key, 'o') == id
      if held then call('PEXPIRE', key, ttl_arg) end
    elseif kind == 'h' then
      held = read('HEXISTS', key, id) == 1
      if held then call('PEXPIRE', key, ttl_arg) end
    elseif kind == 'z' then
      held = renew_member(key, id)
    elseif kind == 'R' then
      held = renew_member(key, id)
      if held then prolong(keys[k + 1]) end
      k = k + 1
    elseif kind == 'P' then
      held = renew_member(key, id)
      if held then
        prolong(keys[k + 1])
        prolong(keys[k + 2])
      end
      k = k + 2
    end
    k = k + 1
    if unsure then
      out[i] = -1
    else
      out[i] = held and 1 or 0
    end
  end
end
return out
