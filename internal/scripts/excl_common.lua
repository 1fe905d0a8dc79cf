-- excl_common: the exclusive lock that Mutex, ReentrantMutex and Election
-- share, included by the excl_*.lua scripts; not a script of its own.
--
-- A lock named n keeps these keys, all with the hash tag {n}:
--   K   p{n}       hash  k: the kind ('mutex', 'reentrant_mutex', 'election')
--                        o: the holder's ID; absent while the lock is free
--                        n: the holder's hold count (counted kinds)
--                        f: the fencing token of the current or last hold
--                        x: tokens reserved after f (see Reservations)
--                        q: present when Q may have members; absent only
--                           when Q has none (the hot paths of excl_try and
--                           excl_unlock skip the queue when it is absent);
--                           'c' while only cohorting waiters of the
--                           holder's Client queued since a grant of
--                           excl_try's hot path (see excl_try)
--   Q   p{n}:mq    zset  waiter -> arrival (server microseconds): the queue
--   QE  p{n}:mqe   zset  waiter -> expiry of its waiting mark (server ms)
--   F   p{n}:f     string the token memory every lock kind shares (lib.lua)
--   RL  p{n}:rl    zset  an RWMutex's readers: only looked at, by take_over
-- and publishes on p{n}:ch. K expires with the holder's lease; released, it
-- keeps k, f and x for fence_memory ms, so that the next Lock takes the hot
-- path, and a lock of another kind may take the name over (take_over). Q
-- and QE lose members by purge and vanish when empty; their key TTLs cover
-- the latest mark, so crashed waiters leave nothing behind for good.
--
-- A waiter is "<lease>:<id>" or "<lease>+<reserve>:<id>": the ID it will
-- hold the lock under (it starts with its Client's ID and a dot), after the
-- fixed lease it asked for in ms, or 0 for a lease the watchdog renews, and
-- optionally the number of fencing tokens to reserve after its own (a Mutex
-- WithCohort hands its hold on locally with the reserved tokens).
--
-- Reservations: K's field x, when present, is a count of tokens reserved
-- after f; the next token follows f + x. A hold that reserves none leaves
-- an older count in place: the next token then skips a few, which costs
-- nothing, where clearing it would cost the hot path a write.
--
-- The queue hint q keeps this invariant: while K holds a kind and Q has
-- members, K has q. take sets it (K may be new while Q still has members),
-- every script that adds to Q sets it, and only free, called once Q is
-- seen empty, clears it. A q left over after Q empties (purge, its TTL)
-- only sends the next try or unlock down the slow path, which clears it.
--
-- Handoff: a release with live waiters queued does not free K. It makes the
-- first waiter the holder at once, with a new fencing token, its fixed lease
-- or else what remains of its waiting mark as the lease, and publishes
-- "<from>|1|g|<id>|<token>|<ttl>": the waiter learns it holds the lock from
-- the message alone, without another round trip. So waiters are served in
-- arrival order, across Clients. A release that hands the lock to a waiter
-- of its own Client publishes nothing, as that Client wakes it directly.
-- A counted kind hands it over claimed too (count 1): the holder's Client
-- records the hold from the message, and a try or a cancel of that owner
-- tells a hold the Client took from one it has not taken yet by the count
-- the Client sends (its 'known' argument; see excl_try and excl_cancel).

--#include lib.lua

-- An error reply when the queue's keys are not zsets.
local function queue_keys(Q, QE)
  return aux_key(Q, 'zset') or aux_key(QE, 'zset')
end

-- The lock's fields, as main_key reads them from K, once the queue's keys
-- are checked too; or nil and an error reply.
local function excl_open(K, kind, Q, QE, ...)
  local v, bad = main_key(K, kind, ...)
  return v, bad or queue_keys(Q, QE)
end

-- Drop the waiters whose mark expired.
local function purge(Q, QE, now)
  for _, w in ipairs(take_expired(QE, now)) do
    redis.call('ZREM', Q, w)
  end
end

-- Make id the holder of K with a lease of ttl ms and the next fencing token
-- after last (the highest token issued or reserved that K knew of, or nil:
-- F's; see issue_fence); count is its hold count; reserve (> 0) reserves
-- that many tokens after the new one. Returns the token.
local function take(K, F, kind, id, ttl, last, count, reserve)
  local f = issue_fence(F, last, reserve)
  if reserve and reserve > 0 then
    redis.call('HSET', K, 'k', kind, 'o', id, 'n', count, 'f', f, 'q', '1', 'x', reserve)
  else
    redis.call('HSET', K, 'k', kind, 'o', id, 'n', count, 'f', f, 'q', '1')
  end
  redis.call('PEXPIRE', K, ttl)
  return f
end

-- Free K, keeping its kind and last token for fence_memory. Call only when
-- Q has no members: it clears q.
local function free(K)
  redis.call('HDEL', K, 'o', 'n', 'q')
  redis.call('PEXPIRE', K, fence_memory)
end

-- Make the first live waiter the holder of K (free, or the caller's to give
-- away) and tell it so, unless it waits on Client from, the caller, which
-- wakes it itself. Every kind hands it over with count 1. last is the
-- highest token K knows of (see take). Returns the waiter's ID,
-- token and lease in ms, or nil when nobody waits (then K is unchanged).
-- Call after purge.
local function grant_first(K, F, kind, Q, QE, CH, from, now, last)
  while true do
    local first = redis.call('ZRANGE', Q, 0, 0)[1]
    if not first then
      return nil
    end
    redis.call('ZREM', Q, first)
    local expiry = tonumber(redis.call('ZSCORE', QE, first) or '0')
    redis.call('ZREM', QE, first)
    if expiry > now then
      local lease, id, reserve = parse_waiter(first)
      local ttl = expiry - now
      if lease > 0 and lease < ttl then
        ttl = lease
      end
      local f = take(K, F, kind, id, ttl, last, 1, reserve)
      if client_of(id) ~= from then
        redis.call('PUBLISH', CH, msg_handed(from, id, f, ttl))
      end
      return id, f, ttl
    end
  end
end

-- The holder gives K up: hand it to the first live waiter, or else free it.
-- fence is K's token (see known_fence). Returns the ID, token and lease of
-- the waiter it went to, or nil.
local function pass_on(K, F, kind, Q, QE, CH, from, fence)
  local now = now_ms()
  purge(Q, QE, now)
  local id, f, ttl = grant_first(K, F, kind, Q, QE, CH, from, now, known_fence(K, fence))
  if not id then
    free(K)
  end
  return id, f, ttl
end

-- pass_on as a release script's reply: {code, id, token, ttl} when the lock
-- went to the waiter id, else {code, ''}; an error reply, before anything
-- changes, when the queue's keys are not zsets.
local function pass_on_reply(code, K, F, kind, Q, QE, CH, from, fence)
  local bad = queue_keys(Q, QE)
  if bad then
    return bad
  end
  local id, f, ttl = pass_on(K, F, kind, Q, QE, CH, from, fence)
  if id then
    return {code, id, f, ttl}
  end
  return {code, ''}
end
