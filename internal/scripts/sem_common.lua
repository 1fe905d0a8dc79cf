-- sem_common: the Semaphore, included by every sem_*.lua script; not a
-- script of its own.
--
-- A Semaphore named n keeps five keys, all with the hash tag {n}:
--   M   p{n}     hash  k: 'semaphore'; total: the permits in all (absent
--                      until set); used: permits held by live permits; seq:
--                      the queue's arrival counter; f: the fencing token of
--                      the last permit; x: the idle expiry in ms, if any
--   H   p{n}:h   zset  permit ID -> expiry of its lease (server ms)
--   C   p{n}:c   hash  permit or waiter ID -> how many permits it holds or needs
--   Q   p{n}:q   zset  waiter ID -> arrival number (the queue)
--   QE  p{n}:qe  zset  waiter ID -> expiry of its waiting mark (server ms)
-- and publishes on p{n}:ch. Expired permits and waiters are purged by
-- whichever script runs next. Without an idle expiry the keys persist; with
-- one, every script that touches the semaphore sets their expiry to at least
-- x ms, and the watchdog's renewals of permits and waiting marks keep them
-- alive while those last: a semaphore nobody uses vanishes x ms after its
-- last use, total and all. Until the total is first set, nothing persists:
-- the keys waiters write expire with their waiting marks (sem_try.lua).
--
-- Fairness: waiters are served in arrival order. A request may take permits
-- only if the free permits also cover every queued request ahead of it (all
-- of the queue, for a request that is not queued), so a large request is
-- never starved by a stream of small ones. A request for more than the
-- total can never be served until the total is raised: it waits, but it is
-- not counted among the requests ahead of others, so it holds nobody back
-- (as golang.org/x/sync/semaphore does not queue such a request). Once the
-- total is raised to cover it, it takes its place in arrival order again.

--#include lib.lua

-- The largest total or request, as MaxPermits in semaphore.go: Lua numbers
-- are doubles, exact only up to 2^53 - 1.
local max_permits = 9007199254740991

-- The main key's fields, after its kind: {kind, total, used, x, f}, or nil
-- and an error reply when any key is not this semaphore's.
local function sem_state(M, H, C, Q, QE)
  local v, bad = main_key(M, 'semaphore', 'total', 'used', 'x', 'f')
  if bad then
    return nil, bad
  end
  bad = aux_key(H, 'zset') or aux_key(C, 'hash') or aux_key(Q, 'zset') or aux_key(QE, 'zset')
  if bad then
    return nil, bad
  end
  return v
end

-- With an idle expiry (ms, or nil), keep every key alive at least that long.
local function touch(M, H, C, Q, QE, idle)
  idle = tonumber(idle or '')
  if idle and idle > 0 then
    for _, k in ipairs({M, H, C, Q, QE}) do
      if redis.call('EXISTS', k) == 1 then
        extend(k, idle)
      end
    end
  end
end

-- Return expired permits to the pool and drop waiters whose mark expired.
-- Returns how many entries it removed: when any, others may now be served.
local function purge(M, H, C, Q, QE, now)
  local gone = take_expired(H, now)
  if #gone > 0 then
    local freed = 0
    for _, id in ipairs(gone) do
      freed = freed + tonumber(redis.call('HGET', C, id) or '0')
      redis.call('HDEL', C, id)
    end
    redis.call('HINCRBY', M, 'used', -freed)
  end
  local left = take_expired(QE, now)
  for _, id in ipairs(left) do
    redis.call('HDEL', C, id)
    redis.call('ZREM', Q, id)
  end
  return #gone + #left
end

-- Queue request id at the tail of the queue, by the next arrival number.
local function enqueue(M, Q, id)
  -- Arrival numbers only grow, even after M expired under a queue.
  local seq = redis.call('HINCRBY', M, 'seq', 1)
  local last = redis.call('ZRANGE', Q, -1, -1, 'WITHSCORES')
  if last[2] and tonumber(last[2]) >= seq then
    seq = tonumber(last[2]) + 1
    redis.call('HSET', M, 'seq', seq)
  end
  redis.call('ZADD', Q, seq, id)
end

-- Free permits (may be negative after the total was lowered) and the total,
-- or nil when the total was never set.
local function available(M)
  local v = redis.call('HMGET', M, 'total', 'used')
  local total = v[1] and tonumber(v[1])
  return (total or 0) - tonumber(v[2] or '0'), total
end

-- Permits needed by the queued waiters, first..last (1-based, inclusive),
-- that the total (a number, or nil when never set) can serve: a request for
-- more than the total holds nobody back (see Fairness).
local function needed(C, Q, first, last, total)
  local sum = 0
  if last < first then return 0 end
  for _, id in ipairs(redis.call('ZRANGE', Q, first - 1, last - 1)) do
    local need = tonumber(redis.call('HGET', C, id) or '0')
    if need <= (total or 0) then
      sum = sum + need
    end
  end
  return sum
end

-- Call serve(id, need) for each queued request that the free permits serve
-- now, in queue order, passing over requests for more than the total (see
-- Fairness).
local function each_servable(M, C, Q, serve)
  local avail, total = available(M)
  -- The queue is read in batches, by arrival number (which serve's removals
  -- do not shift), so that a release reads about as many requests as it
  -- can serve, not the whole queue: each request needs at least a permit,
  -- and only requests for more than the total are passed over.
  local after, size = '-inf', math.max(avail, 0) + 8
  while true do
    local batch = redis.call('ZRANGEBYSCORE', Q, after, '+inf', 'WITHSCORES', 'LIMIT', 0, size)
    for i = 1, #batch, 2 do
      local id = batch[i]
      local need = tonumber(redis.call('HGET', C, id) or '0')
      if need <= (total or 0) then
        if need > avail then
          return
        end
        avail = avail - need
        serve(id, need)
      end
    end
    if #batch < 2 * size then
      return
    end
    after, size = '(' .. batch[#batch], size * 2
  end
end

-- Publish, and return, the release message naming the queued waiters that
-- the free permits can serve now (each_servable); '' when there are none.
local function wake_servable(M, C, Q, CH, from)
  local ids = {}
  each_servable(M, C, Q, function(id)
    ids[#ids + 1] = id
  end)
  if #ids == 0 then return '' end
  -- (ids is bounded by the queue; each is a 26-character ID.)
  local msg = msg_ids(from, ids)
  redis.call('PUBLISH', CH, msg)
  return msg
end

-- Hand permits to the queued waiters that the free permits serve now, the
-- same waiters, in the same order, as wake_servable names: each gets its
-- request as a permit of its own ID, with the next fencing token after
-- fence (M's f) and what is left of its waiting mark as its lease, leaves
-- the queue, and is told by the message '<from>|1|g|<id>|<token>|<ttl>',
-- published unless it is on Client from. A try of that ID then finds its
-- permit granted and claims it (sem_try.lua). Only IDs '<client>.g.<...>'
-- take grants (internal/wire's PermitID); a request of an earlier version's
-- Client, whose try would take the permits a second time, is named in a
-- release message instead, as wake_servable does, and tries; so is one
-- whose mark is gone. Returns the messages, published or not, for the
-- caller's Client to apply to its own waiters.
local function grant_servable(M, H, C, Q, QE, CH, from, now, fence)
  local msgs, named = {}, {}
  each_servable(M, C, Q, function(id, need)
    -- Marks that ran out were purged; a place without a mark is named, as
    -- wake_servable would.
    local ttl = tonumber(redis.call('ZSCORE', QE, id) or '0') - now
    if ttl <= 0 or not string.find(id, '^[^.]*%.g%.') then
      named[#named + 1] = id
      return
    end
    fence = next_fence(fence)
    redis.call('HINCRBY', M, 'used', need)
    redis.call('ZADD', H, now + ttl, id)
    redis.call('ZREM', Q, id)
    redis.call('ZREM', QE, id)
    local msg = msg_handed(from, id, fence, ttl)
    if client_of(id) ~= from then
      redis.call('PUBLISH', CH, msg)
    end
    msgs[#msgs + 1] = msg
  end)
  if #msgs > 0 then
    redis.call('HSET', M, 'f', fence)
  end
  if #named > 0 then
    local msg = msg_ids(from, named)
    redis.call('PUBLISH', CH, msg)
    msgs[#msgs + 1] = msg
  end
  return msgs
end

-- sem_state, then the purge of expired permits and waiters at the server's
-- clock; when from is given and the purge freed anything, the waiters now
-- served are woken (wake_servable, publishing from from). Returns v, nil
-- and the clock (ms), or nil and an error reply.
local function sem_open(M, H, C, Q, QE, CH, from)
  local v, bad = sem_state(M, H, C, Q, QE)
  if bad then
    return nil, bad
  end
  local now = now_ms()
  if purge(M, H, C, Q, QE, now) > 0 and from then
    wake_servable(M, C, Q, CH, from)
  end
  return v, nil, now
end
