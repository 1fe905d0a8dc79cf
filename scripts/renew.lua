-- renew: extend many watchdog leases in one call. It never re-creates a key
-- or a member, and never gives an expiry to a key that has none.
--
-- KEYS       the keys of the leases, in order (all in one hash slot on Redis
--            Cluster); each lease uses one key, or two for kind 'R'
-- ARGV[1]    the new lease in milliseconds
-- ARGV[i+1]  lease i: a one-letter kind followed by an ID
--              's<token>'  KEYS: a string lock whose value must be <token>
--              'h<owner>'  KEYS: a hash lock in which field <owner> must exist
--              'z<member>' KEYS: a zset of leases scored by expiry (server
--                          milliseconds); <member> must be there, unexpired
--              'R<id>'     KEYS: a zset as for 'z', and a companion key that
--                          lives as long (an RWMutex's read-count hash, a
--                          Mutex's queue)
--
-- Returns an array: element i is 1 when lease i was renewed, 0 when the hold
-- is gone (or a key has another type). One bad key never fails the batch.
local ttl = tonumber(ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- Lengthen a key's expiry to at least ttl, if it has one.
local function extend(key)
  local pttl = redis.call('PTTL', key)
  if pttl >= 0 and pttl < ttl then
    redis.call('PEXPIRE', key, ttl)
  end
end

local function renew_member(key, member)
  local score = redis.pcall('ZSCORE', key, member)
  if type(score) ~= 'string' or tonumber(score) <= now then
    return false
  end
  redis.call('ZADD', key, 'XX', now + ttl, member)
  extend(key)
  return true
end

local out = {}
local k = 1
for i = 2, #ARGV do
  local spec = ARGV[i]
  local kind, id = string.sub(spec, 1, 1), string.sub(spec, 2)
  local key = KEYS[k]
  local held = false
  if kind == 's' then
    held = redis.pcall('GET', key) == id
    if held then redis.call('PEXPIRE', key, ttl) end
  elseif kind == 'h' then
    held = redis.pcall('HEXISTS', key, id) == 1
    if held then redis.call('PEXPIRE', key, ttl) end
  elseif kind == 'z' then
    held = renew_member(key, id)
  elseif kind == 'R' then
    held = renew_member(key, id)
    if held then extend(KEYS[k + 1]) end
    k = k + 1
  end
  k = k + 1
  out[i - 1] = held and 1 or 0
end
return out
