-- rw_try_write: take, claim or re-enter the write hold of an RWMutex, or
-- queue for it (includes rw_common.lua). It takes and returns what
-- excl_try.lua does, so that the write side runs on the exclusive locks'
-- engine (see rw_common.lua); the lock's hold is named by its grant ID.
--
-- KEYS[1..7]  W, RL, RC, Q, QE, F (see rw_common.lua), and the channel
-- ARGV[1]     the kind, as the engine sends it (unused: W's is 'rwlock')
-- ARGV[2]     the waiter: '<lease>[+<reserve>]:w<grant ID>'
-- ARGV[3]     the lease to apply in ms
-- ARGV[4]     waiting mark lease in ms; 0 for a try that will not wait
-- ARGV[5]     the Client's ID, for a grant message
-- ARGV[6]     '1': re-entry adds a hold; '0': it claims (unused otherwise)
-- ARGV[7]     the grant ID, and
-- ARGV[8]     its reservation, as ARGV[2] has them
-- ARGV[9]     the write holds the Client has recorded for the grant
--             (absent: 0); a write hold of the grant it has not recorded
--             is a hand-over not taken yet, which the try claims (count 1,
--             lease reset)
-- ARGV[10]    the owner ID, for the upgrade check
--
-- Returns held(count, token) (lib.lua) when the grant holds the write lock
-- (a new hold gets a new fencing token, with ARGV[8] more reserved after
-- it; re-entry keeps it and the lease); a new hold of a lock that nobody
-- was queued for is answered with the token alone, a string standing for
-- held(1, token), as excl_try's hot path answers: a quiet grant (W's q,
-- rw_common.lua). A waiter queued while a writer holds is recorded in q,
-- and the first since a quiet grant announced (note_queued, queue_hint.lua). An owner
-- that reads without writing (a claimed read hold) gets DLOCK_UPGRADE:
-- waiting for its own read hold to end would deadlock. Otherwise returns
-- busy(ms until the earliest blocking lease runs out, the blocking holder
-- or '' (the writer's grant, or a reader's owner), the writer's token or
-- '', 1 when this try queued the waiter anew else 0), queueing it when
-- ARGV[4] > 0. A released lock of another lock kind is taken over
-- (take_over, lib.lua). Keys of another kind fail with DLOCK_KIND before
-- anything changes.
--#include rw_common.lua
--#include queue_hint.lua
local W, RL, RC, Q, QE, F, CH = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local waiter, ttl, mark, from = ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local id, reserve, owner = ARGV[7], tonumber(ARGV[8] or '0'), ARGV[10] or ''
local v, bad = main_key(W, 'rwlock', 'o', 'n', 'f', 'q', 'x')
local aux = rw_keys(RL, RC, Q, QE) -- (before a take-over, which deletes W)
local carried -- the token memory of a released lock of another kind
if bad then
  carried = not aux and take_over(W, Q, nil)
  if not carried then
    return bad
  end
  v = {}
end
if aux then
  return aux
end
local holder, fence = v[2], v[4]
if holder == id then
  if ARGV[6] == '1' and tonumber(ARGV[9] or '0') > 0 then
    return held(redis.call('HINCRBY', W, 'n', 1), fence)
  end
  redis.call('HSET', W, 'n', 1) -- a hand-over claimed
  redis.call('PEXPIRE', W, ttl)
  return held(1, fence)
end
local s, us = now_parts()
local now = s * 1000 + math.floor(us / 1000)
purge(RL, RC, Q, QE, now)
-- (A read handed to the owner and not claimed yet, count 0, is no read
-- hold: the owner's read call may still give it up. The writer waits
-- behind it meanwhile, as behind any reader.)
if owner ~= '' and tonumber(redis.call('HGET', RC, owner) or '0') >= 1 then
  return redis.error_reply('DLOCK_UPGRADE the owner holds a read lock')
end
if not holder and redis.call('ZCARD', RL) == 0 then
  local first = redis.call('ZRANGE', Q, 0, 0)[1]
  if not first or first == waiter then
    redis.call('ZREM', Q, waiter)
    redis.call('ZREM', QE, waiter)
    -- Nobody queued: a quiet grant (q, rw_common.lua), answered with the
    -- token alone, as excl_try's hot path answers its own.
    local quiet = not first
    local f = take_write(W, F, id, carried or (fence and known_fence(W, fence)), reserve, quiet)
    redis.call('PEXPIRE', W, ttl)
    if quiet then
      if v[5] then
        redis.call('HDEL', W, 'q') -- (left by a release of an earlier version)
      end
      return f
    end
    return held(1, f)
  end
  -- Announced from nobody (''), so that the caller's own Client applies it
  -- too: this try learns only whether the lock went to itself.
  local to, f = admit(false, W, F, RL, RC, Q, QE, CH, '', now, fence)
  if to == id then
    redis.call('HSET', W, 'n', 1) -- handed to this very try: claimed
    redis.call('PEXPIRE', W, ttl)
    return held(1, f)
  end
  holder = redis.call('HGET', W, 'o')
  v[5] = '1' -- a writer admitted now holds by a grant that is not quiet (take_write)
end
local added = 0
if mark > 0 then
  added = enqueue(Q, QE, waiter, s, us, now, mark)
  note_queued(W, CH, from, holder, v[5], v[6], added, reserve > 0 and holder and client_of(holder) == from)
end
-- The holder, as excl_try names it: the writer, with its token (a reader,
-- with none, when only readers block).
local left, token = nil, ''
if holder then
  left, token = redis.call('PTTL', W), redis.call('HGET', W, 'f')
else
  local first = redis.call('ZRANGE', RL, 0, 0, 'WITHSCORES')
  left = first[2] and (tonumber(first[2]) - now)
  holder = first[1] or ''
end
return busy(left, holder, token, added)
