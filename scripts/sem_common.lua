-- sem_common: prepended to every sem_*.lua script; not a script of its own.
--
-- A Semaphore named n keeps five keys, all with the hash tag {n}:
--   M   p{n}     hash  'total' permits, 'used' by live permits, 'seq' counter
--   H   p{n}:h   zset  permit ID -> expiry of its lease (server ms)
--   C   p{n}:c   hash  permit or waiter ID -> how many permits it holds or needs
--   Q   p{n}:q   zset  waiter ID -> arrival number (the queue)
--   QE  p{n}:qe  zset  waiter ID -> expiry of its waiting mark (server ms)
-- and publishes on p{n}:ch. Nothing expires by key TTL: expired permits and
-- waiters are purged by whichever script runs next.
--
-- Fairness: waiters are served in arrival order. A request may take permits
-- only if the free permits also cover every queued request ahead of it (all
-- of the queue, for a request that is not queued), so a large request is
-- never starved by a stream of small ones.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Return expired permits to the pool and drop waiters whose mark expired.
-- Returns how many entries it removed: when any, others may now be served.
local function purge(M, H, C, Q, QE, now)
  local gone = redis.call('ZRANGEBYSCORE', H, '-inf', now)
  if #gone > 0 then
    local freed = 0
    for _, id in ipairs(gone) do
      freed = freed + tonumber(redis.call('HGET', C, id) or '0')
      redis.call('HDEL', C, id)
    end
    redis.call('ZREMRANGEBYSCORE', H, '-inf', now)
    redis.call('HINCRBY', M, 'used', -freed)
  end
  local left = redis.call('ZRANGEBYSCORE', QE, '-inf', now)
  if #left > 0 then
    for _, id in ipairs(left) do
      redis.call('HDEL', C, id)
      redis.call('ZREM', Q, id)
    end
    redis.call('ZREMRANGEBYSCORE', QE, '-inf', now)
  end
  return #gone + #left
end

-- Free permits (may be negative after the total was lowered) and the total,
-- or nil when the total was never set.
local function available(M)
  local v = redis.call('HMGET', M, 'total', 'used')
  local total = v[1] and tonumber(v[1])
  return (total or 0) - tonumber(v[2] or '0'), total
end

-- Permits needed by the queued waiters, first..last (1-based, inclusive).
local function needed(C, Q, first, last)
  local sum = 0
  if last < first then return 0 end
  for _, id in ipairs(redis.call('ZRANGE', Q, first - 1, last - 1)) do
    sum = sum + tonumber(redis.call('HGET', C, id) or '0')
  end
  return sum
end

-- Publish, and return, the release message naming the queued waiters that
-- the free permits can serve now, in queue order; '' when there are none.
-- A waiter wanting more than the total is named too, so that it learns so
-- at once instead of holding the queue up.
local function wake_servable(M, C, Q, CH, from)
  local avail, total = available(M)
  local ids = {}
  for _, id in ipairs(redis.call('ZRANGE', Q, 0, -1)) do
    local need = tonumber(redis.call('HGET', C, id) or '0')
    if total and need > total then
      ids[#ids + 1] = id
    elseif need > avail then
      break
    else
      avail = avail - need
      ids[#ids + 1] = id
    end
  end
  if #ids == 0 then return '' end
  -- (ids is bounded by the queue; each is a 26-character ID.)
  local msg = from .. '|0||' .. table.concat(ids, ',')
  redis.call('PUBLISH', CH, msg)
  return msg
end
