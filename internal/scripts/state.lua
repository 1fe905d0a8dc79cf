-- state: what a primitive of any kind looks like now, for inspection
-- (Status, and the dlock command's status and list). It changes nothing
-- and purges nothing: expired holds and waiters are left out, not removed.
--
-- KEYS[1]     the main key p{n}
-- KEYS[2..9]  its auxiliary keys, whichever kind it is: :mq :mqe (the queue
--             of an exclusive lock or RWMutex), :rl :rc (an RWMutex's
--             readers), :h :c :q :qe (a Semaphore's permits and queue)
-- ARGV[1]     the kind the caller expects, or '' for any
-- ARGV[2]     the most holders to list
--
-- Returns {kind ('' when there is no such key), fencing token of the
-- current or last hold or '', live waiters queued, holders, total, free,
-- count}, where holders is a flat array {id, ms left, count, read (1 or 0),
-- ...}; total and free are a Semaphore's (total -1 when never set), count a
-- latch's. A released lock (no holder, reader or live waiter), whose key
-- keeps only its kind and token memory, reads as no key, whatever kind the
-- caller expects: a lock of any kind may take its name (take_over). A key
-- of another kind than ARGV[1] fails with DLOCK_KIND.
--#include lib.lua
local K = KEYS[1]
local MQ, MQE, RL, RC, H, C, SQ, SQE = KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local want, most = ARGV[1], tonumber(ARGV[2])

local v = redis.pcall('HMGET', K, 'k', 'o', 'n', 'f', 'total', 'used', 'count')
if v.err then
  return foreign(K, redis.call('TYPE', K)['ok'])
end
local kind = v[1]
if not kind then
  if redis.call('EXISTS', K) == 1 then
    return foreign(K, 'a hash of another program')
  end
  return {'', '', 0, {}, -1, 0, 0}
end
local now = now_ms()
local holders = {}

local function live_count(Z)
  local n = redis.pcall('ZCOUNT', Z, '(' .. now, '+inf')
  if type(n) ~= 'number' then
    return 0
  end
  return n
end

if lock_kinds[kind] and not v[2] and live_count(MQE) == 0 and (kind ~= 'rwlock' or live_count(RL) == 0) then
  return {'', v[4] or '', 0, {}, -1, 0, 0}
end
if want ~= '' and kind ~= want then
  return foreign(K, a(kind))
end

-- Live members of a lease zset (scored by expiry), with their counts in CH.
local function members(Z, CH, read)
  local ok, live = pcall(redis.call, 'ZRANGEBYSCORE', Z, '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, most)
  if not ok then
    return
  end
  for i = 1, #live, 2 do
    local n = tonumber(redis.pcall('HGET', CH, live[i]) or '0') or 0
    holders[#holders + 1] = live[i]
    holders[#holders + 1] = tonumber(live[i + 1]) - now
    holders[#holders + 1] = n
    holders[#holders + 1] = read
  end
end

local total, free, count = -1, 0, 0
local waiting = 0
if kind == 'semaphore' then
  members(H, C, 0)
  waiting = live_count(SQE)
  total = tonumber(v[5] or '-1')
  if total >= 0 then
    local used = 0
    for i = 3, #holders, 4 do
      used = used + holders[i]
    end
    free = total - used
  end
elseif kind == 'latch' then
  count = tonumber(v[7] or '0')
else
  if v[2] then
    local left = math.max(redis.call('PTTL', K), 0)
    holders = {v[2], left, tonumber(v[3] or '0'), 0}
  end
  if kind == 'rwlock' then
    members(RL, RC, 1)
  end
  waiting = live_count(MQE)
end
return {kind, v[4] or '', waiting, holders, total, free, count}
