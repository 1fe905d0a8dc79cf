-- rw_common: prepended to every rw_*.lua script; not a script of its own.
--
-- An RWMutex named n keeps four keys, all with the hash tag {n}:
--   W   p{n}     hash  writer owner ID -> write hold count (one field at most);
--                      expires with the writer's lease
--   RL  p{n}:rl  zset  reader owner ID -> expiry of its read lease (server ms)
--   RC  p{n}:rc  hash  reader owner ID -> read hold count
--   WW  p{n}:ww  zset  waiting writer owner ID -> expiry of its waiting mark
-- and publishes on p{n}:ch. A reader whose lease expired is gone as soon as
-- any script purges it. A waiting mark keeps new readers out, which is what
-- makes the lock prefer writers.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Drop expired read leases and waiting marks.
local function purge(RL, RC, WW, now)
  local gone = redis.call('ZRANGEBYSCORE', RL, '-inf', now)
  for _, owner in ipairs(gone) do
    redis.call('HDEL', RC, owner)
  end
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', RL, '-inf', now)
  end
  redis.call('ZREMRANGEBYSCORE', WW, '-inf', now)
end

-- Lengthen a key's expiry to at least ms.
local function extend(key, ms)
  if redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, ms)
  end
end

-- The release message for whoever can proceed now that the lock has changed
-- (see wait.go for its format), or nil when nobody new can.
local function wake_message(from, W, RL, WW)
  if redis.call('HLEN', W) > 0 then
    return nil -- a writer holds it
  end
  local readers = redis.call('ZCARD', RL)
  if redis.call('ZCARD', WW) > 0 then
    if readers == 0 then
      return from .. '|1|w' -- free: one waiting writer may take it
    end
    return nil -- readers hold it, and the waiting writer keeps new ones out
  end
  if readers == 0 then
    return from .. '|0|' -- free, no writer waiting: everyone may try
  end
  return from .. '|0|r' -- read-held, no writer waiting: readers may join
end
