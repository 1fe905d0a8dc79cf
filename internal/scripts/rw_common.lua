-- rw_common: the RWMutex, included by the rw_*.lua scripts; not a script of
-- its own.
--
-- An RWMutex named n keeps five keys, all with the hash tag {n}:
--   W   p{n}      hash  k: 'rwlock'
--                       o: the writer's grant ID (a fresh ID per write
--                          acquisition, whose owner only its Client knows:
--                          see engine's Reentrant); absent while nobody writes
--                       n: its write count
--                       f: the fencing token of the current or last write
--                       x: the tokens the write grant reserved after f, for
--                          its Client's local handoffs (absent: none)
--                       q: while a writer holds, who queued since its grant,
--                          as excl_try's hint on K: absent, nobody (a quiet
--                          grant: rw_try_write found nobody queued, and said
--                          so by its reply); 'c', only cohorting writers of
--                          the holder's Client; '1', anyone else, or the
--                          grant was not quiet. The first reader, or writer
--                          of another Client, to queue since a quiet grant
--                          that reserved tokens announces itself
--                          ('<from>|0|q'; see queue_hint.lua)
--   RL  p{n}:rl   zset  reader owner ID -> expiry of its read lease (server ms)
--   RC  p{n}:rc   hash  reader owner ID -> read count (0: handed to it, not
--                       yet claimed)
--   Q   p{n}:mq   zset  waiter -> arrival (server microseconds): the queue
--   QE  p{n}:mqe  zset  waiter -> expiry of its waiting mark (server ms)
--   F   p{n}:f    string the token memory every lock kind shares (lib.lua)
-- and publishes on p{n}:ch. W expires with the writer's lease; free of
-- writers, it keeps k and f for fence_memory ms, and for as long as any
-- reader holds (readers' renewals lengthen it too), so that the name keeps
-- its kind while only readers hold it. A reader whose
-- lease expired is dropped by the next script that purges. A waiter is
-- '<lease>[+<reserve>]:<r|w><ID>': its fixed lease in ms (0: renewed by
-- the watchdog), the tokens a writer reserves after its own, whether it
-- reads or writes, and a reader's owner ID or a writer's grant ID.
--
-- Fairness, as sync.RWMutex gives it: while a writer waits, new readers
-- queue behind it, so readers cannot starve writers; when a writer
-- releases, every reader queued gets the lock at once, before the next
-- writer, so writers cannot starve readers; when the last reader releases,
-- the first writer queued gets it. A release that lets someone in hands the
-- lock over directly, and publishes '<from>|1|g|<owner,...>|<token>|<ttl>'
-- unless every owner it went to is on Client from, the caller. A writer is
-- handed the lock claimed (write count 1): its Client records the hold from
-- the message, and a write try or cancel of that grant tells a hold the
-- Client took from one it has not taken yet by the count the Client sends
-- (see rw_try_write, rw_cancel). Readers are handed it unclaimed (read
-- count 0) and claim it with a try.
--
-- Writers run on the engine of a ReentrantMutex (engine's Reentrant): the
-- write scripts take and return what the excl_*.lua scripts do, so that a
-- Client hands a write hold from one owner to another of its own without a
-- round trip (lock cohorting, within the bounds of WithCohort), under the
-- same grant ID and with the next of the tokens the grant reserved. Readers
-- queued meanwhile wait for the cohort's release, which lets them in before
-- the next writer, as after any writer.

--#include lib.lua

-- An error reply when an auxiliary key is not of its type.
local function rw_keys(RL, RC, Q, QE)
  return aux_key(RL, 'zset') or aux_key(RC, 'hash') or aux_key(Q, 'zset') or aux_key(QE, 'zset')
end

-- The lock's fields, as main_key reads them from W, once every key is
-- checked; or nil and an error reply.
local function rw_open(W, RL, RC, Q, QE, ...)
  local v, bad = main_key(W, 'rwlock', ...)
  return v, bad or rw_keys(RL, RC, Q, QE)
end

-- Drop expired readers and waiters.
local function purge(RL, RC, Q, QE, now)
  for _, owner in ipairs(take_expired(RL, now)) do
    redis.call('HDEL', RC, owner)
  end
  for _, w in ipairs(take_expired(QE, now)) do
    redis.call('ZREM', Q, w)
  end
end

-- Whether a writer is queued; and the first live waiter.
local function writer_queued(Q)
  for _, w in ipairs(redis.call('ZRANGE', Q, 0, -1)) do
    local _, role = parse_rw(w)
    if role == 'w' then
      return true
    end
  end
  return false
end

-- The lease a waiter gets when handed the lock: its fixed lease, or what
-- remains of its mark.
local function handed_ttl(QE, w, lease, now)
  local ttl = tonumber(redis.call('ZSCORE', QE, w) or '0') - now
  if lease > 0 and lease < ttl then
    ttl = lease
  end
  return ttl
end

-- Publish a hand-over to owners unless all are the caller's own.
local function announce(CH, from, owners, fence, ttl)
  for _, o in ipairs(owners) do
    if client_of(o) ~= from then
      redis.call('PUBLISH', CH, msg_handed(from, table.concat(owners, ','), fence, ttl))
      return
    end
  end
end

-- Hand the lock to every live reader queued (read count 0, unclaimed).
-- Returns their owners, and the longest of their leases.
local function grant_readers(RL, RC, Q, QE, CH, from, now)
  local owners, longest = {}, 0
  for _, w in ipairs(redis.call('ZRANGE', Q, 0, -1)) do
    local lease, role, owner = parse_rw(w)
    if role == 'r' then
      local ttl = handed_ttl(QE, w, lease, now)
      redis.call('ZREM', Q, w)
      redis.call('ZREM', QE, w)
      if ttl > 0 then
        redis.call('ZADD', RL, now + ttl, owner)
        redis.call('HSET', RC, owner, 0)
        extend(RL, ttl)
        extend(RC, ttl)
        owners[#owners + 1] = owner
        longest = math.max(longest, ttl)
      end
    end
  end
  if #owners > 0 then
    announce(CH, from, owners, '0', longest)
  end
  return owners, longest
end

-- Make W the write hold of grant id, count 1, with the next token after
-- last (the highest W knows of, or nil: F's) and reserve more reserved
-- after it. Returns the token. The grant is not quiet (q '1') unless quiet
-- says so; then the caller sees that W has no q left.
local function take_write(W, F, id, last, reserve, quiet)
  local f = issue_fence(F, last, reserve)
  if quiet then
    redis.call('HSET', W, 'k', 'rwlock', 'o', id, 'n', 1, 'f', f)
  else
    redis.call('HSET', W, 'k', 'rwlock', 'o', id, 'n', 1, 'f', f, 'q', '1')
  end
  if reserve > 0 then
    redis.call('HSET', W, 'x', reserve)
  else
    redis.call('HDEL', W, 'x')
  end
  return f
end

-- Hand W to the first live writer queued (write count 1, claimed), with
-- the next fencing token after fence (W's, or nil: F's) and its
-- reservation. Returns its grant ID and token, or nil.
local function grant_writer(W, F, Q, QE, CH, from, now, fence)
  for _, w in ipairs(redis.call('ZRANGE', Q, 0, -1)) do
    local lease, role, owner, reserve = parse_rw(w)
    if role == 'w' then
      local ttl = handed_ttl(QE, w, lease, now)
      redis.call('ZREM', Q, w)
      redis.call('ZREM', QE, w)
      if ttl > 0 then
        local f = take_write(W, F, owner, fence and known_fence(W, fence), reserve)
        redis.call('PEXPIRE', W, ttl)
        announce(CH, from, {owner}, f, ttl)
        return owner, f, ttl
      end
    end
  end
  return nil
end

-- While nobody writes, W keeps the lock's kind (and last token) for as long
-- as any reader holds, and fence_memory at least, so that a primitive of
-- another kind cannot take the name from readers. A writer's W expires with
-- its lease, which this leaves alone.
local function keep_kind(W, RL, now)
  if redis.call('HEXISTS', W, 'o') == 1 then
    return
  end
  redis.call('HSET', W, 'k', 'rwlock')
  local last = redis.call('ZRANGE', RL, -1, -1, 'WITHSCORES')[2]
  extend(W, math.max(tonumber(fence_memory), tonumber(last or '0') - now))
end

-- No writer holds W: keep only its kind and last token.
local function free_writer(W)
  redis.call('HDEL', W, 'o', 'n', 'q')
  redis.call('PEXPIRE', W, fence_memory)
end

-- Someone left: let in whoever may now proceed, if nobody writes. After a
-- writer's release (after_writer) every reader queued goes first; else they
-- go only when no writer is queued (a waiting writer keeps new readers out).
-- The first writer queued goes when nobody holds the lock. Returns the
-- owners handed to, comma-separated, or '', the writer's token or '', and
-- the lease they got in ms (0: none).
local function admit(after_writer, W, F, RL, RC, Q, QE, CH, from, now, fence)
  if redis.call('HEXISTS', W, 'o') == 1 then
    return '', '', 0
  end
  if after_writer or not writer_queued(Q) then
    local readers, ttl = grant_readers(RL, RC, Q, QE, CH, from, now)
    if #readers > 0 then
      keep_kind(W, RL, now)
      return table.concat(readers, ','), '', ttl
    end
  end
  if redis.call('ZCARD', RL) > 0 then
    keep_kind(W, RL, now)
    return '', '', 0
  end
  local owner, f, ttl = grant_writer(W, F, Q, QE, CH, from, now, fence)
  return owner or '', f or '', ttl or 0
end

-- Queue waiter (once) with its mark set to expire mark ms from now, and
-- return 1 when it was not queued before.
local function enqueue(Q, QE, waiter, s, us, now, mark)
  local added = redis.call('ZADD', Q, 'NX', string.format('%d%06d', s, us), waiter)
  redis.call('ZADD', QE, now + mark, waiter)
  extend(Q, mark)
  extend(QE, mark)
  return added
end
