-- redlock: one master's part of a Redlock Mutex (see redlock.go). The lock
-- keeps, on each master, the main key K of an exclusive lock (the hash of
-- excl_common.lua, without its queue: a Redlock queues nobody in Redis) and
-- F, the highest fencing token the master has seen for the name. Each write
-- of F sets its expiry to ARGV[6] ms (the grant's lease and the fence
-- memory, from the caller), so that no counter is kept for good: F outlives
-- the grant's first lease by the fence memory, renewals do not extend it,
-- and once K and F are both gone the next token follows the callers'
-- clocks (see redlock.go). Releases publish on CH.
--
-- KEYS[1..3]  K, F, CH
-- ARGV[1]     the mode:
--               't' try: take K if free, with token max(F, K's f) + 1 or
--                   ARGV[5], whichever is greater
--               'r' re-acquire: take K if free (or keep it if ours) with
--                   token ARGV[5] exactly: a holder re-taking a master that
--                   lost the key (restarted, flushed)
--               'w' write back: raise K's f and F to ARGV[5] if K is ours
--               'u' unlock: free K if ours, and publish
--               'f' force: free K whoever holds it, and publish
--               's' state: {holder or '', PTTL of K, K's token or ''}
-- ARGV[2]     the kind ('mutex')
-- ARGV[3]     the holder's ID
-- ARGV[4]     the lease in ms ('t', 'r')
-- ARGV[5]     the token (decimal) ('t': the least acceptable; 'r', 'w')
-- ARGV[6]     the releaser's ID, sent in the message ('u', 'f'); F's
--             expiry in ms ('t', 'r', 'w')
--
-- Returns: 't', 'r': held(1, token) when the caller holds K now, else
-- busy(ms the holder's lease has left, holder) (lib.lua's replies);
-- 'w', 'u', 'f': 1 when done, 0 when K was not the caller's (not held, for
-- 'f'). A release publishes msg_released(from, holder ID) (lib.lua). Keys
-- of another kind fail with DLOCK_KIND before anything changes.
local K, F, CH = KEYS[1], KEYS[2], KEYS[3]
local mode, kind, id = ARGV[1], ARGV[2], ARGV[3]
-- The hot paths, before any helper is defined (see scripts.go): a try that
-- finds the lock free, and an unlock by the holder.
if mode == 't' then
  local h = redis.pcall('HMGET', K, 'k', 'o', 'f')
  if not h.err and not h[2] and (h[1] == kind or not h[1] and redis.call('EXISTS', K) == 0) then
    local stored = tonumber(redis.call('GET', F) or '0')
    local f = tonumber(h[3] or '0')
    if stored > f then
      f = stored
    end
    f = f + 1
    if tonumber(ARGV[5]) > f then
      f = tonumber(ARGV[5])
    end
    local s = string.format('%.0f', f)
    redis.call('HSET', K, 'k', kind, 'o', id, 'n', 1, 'f', s)
    redis.call('PEXPIRE', K, ARGV[4])
    redis.call('SET', F, s, 'PX', ARGV[6]) -- f > stored
    return {1, 1, s} -- lib.lua's held(1, s)
  end
elseif mode == 'u' then
  local h = redis.pcall('HMGET', K, 'k', 'o')
  if not h.err and h[1] == kind and h[2] == id then
    redis.call('HDEL', K, 'o', 'n')
    redis.call('PEXPIRE', K, 60000)
    redis.call('PUBLISH', CH, ARGV[6] .. '|1|x|' .. id) -- lib.lua's msg_released(ARGV[6], id)
    return 1
  end
end
--#include lib.lua
local v, bad = main_key(K, kind, 'o', 'f')
if bad then
  return bad
end
local holder, fence = v[2], v[3]

-- F := max(F, t); a raised F expires ARGV[6] ms from now.
local function raise(t)
  if t > tonumber(redis.call('GET', F) or '0') then
    redis.call('SET', F, string.format('%.0f', t), 'PX', ARGV[6])
  end
end

if mode == 't' or mode == 'r' then
  local ttl = tonumber(ARGV[4])
  if holder == id then
    redis.call('PEXPIRE', K, ttl)
    return held(1, fence or ARGV[5])
  end
  if holder then
    return busy(redis.call('PTTL', K), holder, '', 0)
  end
  local f = tonumber(ARGV[5])
  if mode == 't' then
    local base = tonumber(redis.call('GET', F) or '0')
    local kf = tonumber(fence or '0')
    if kf > base then
      base = kf
    end
    if base + 1 > f then
      f = base + 1
    end
  end
  local s = string.format('%.0f', f)
  redis.call('HSET', K, 'k', kind, 'o', id, 'n', 1, 'f', s)
  redis.call('PEXPIRE', K, ttl)
  raise(f)
  return held(1, s)
elseif mode == 'w' then
  if holder ~= id then
    return 0
  end
  local t = tonumber(ARGV[5])
  if t > tonumber(fence or '0') then
    redis.call('HSET', K, 'f', ARGV[5])
  end
  raise(t)
  return 1
elseif mode == 'u' or mode == 'f' then
  if not holder or mode == 'u' and holder ~= id then
    return 0
  end
  redis.call('HDEL', K, 'o', 'n')
  redis.call('PEXPIRE', K, 60000)
  redis.call('PUBLISH', CH, msg_released(ARGV[6], holder))
  return 1
elseif mode == 's' then
  return {holder or '', redis.call('PTTL', K), fence or ''}
end
return redis.error_reply('redlock: unknown mode ' .. mode)
