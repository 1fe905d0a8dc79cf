-- rw_try_read: take, claim or re-enter a read hold of an RWMutex, or queue
-- for it (includes rw_common.lua).
--
-- KEYS[1..7]  W, RL, RC, Q, QE, F (see rw_common.lua), and the channel
-- ARGV[1]     the waiter: '<lease>:r<owner>'
-- ARGV[2]     the lease to apply in ms
-- ARGV[3]     waiting mark lease in ms; 0 for a try that will not wait
-- ARGV[4]     the Client's ID, for a grant message
-- ARGV[5]     the grant ID of the owner's write hold, as its Client records
--             it; '' or absent when the owner does not write (W names a
--             write hold by its grant, not its owner: see rw_common.lua)
--
-- Returns {read count, ''} when the owner holds a read lock. A new reader
-- is refused while another owner writes or a writer is queued; the writer
-- itself may also read (downgrade: W's writer is ARGV[5]), and an owner that already reads may
-- re-enter even when a writer waits, or it would deadlock. Re-entry keeps
-- the lease of the owner's first read hold. Otherwise returns {-(ms until
-- the blocking lease runs out, at least 1; 0 for none), the writer or '',
-- '', 1 when this try queued the owner anew else 0}, queueing the owner
-- when ARGV[3] > 0. A released lock of another lock kind is taken over
-- (take_over, lib.lua: its highest token stays in W and F).
-- Keys of another kind fail with DLOCK_KIND before anything changes.
--#include rw_common.lua
--#include queue_hint.lua
local W, RL, RC, Q, QE, F, CH = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local waiter, ttl, mark, from = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local _, _, owner = parse_rw(waiter)
local v, bad = main_key(W, 'rwlock', 'o', 'q', 'x')
local aux = rw_keys(RL, RC, Q, QE) -- (before a take-over, which deletes W)
if bad then
  local carried = not aux and take_over(W, Q, nil)
  if not carried then
    return bad
  end
  -- The taken-over lock's highest token stays: in W, which keeps it for as
  -- long as any reader holds (keep_kind), as a writer's release leaves it,
  -- and in the token memory, which outlives W.
  local fs = string.format('%.0f', carried)
  redis.call('HSET', W, 'k', 'rwlock', 'f', fs)
  redis.call('PEXPIRE', W, fence_memory)
  if carried > remembered_fence(F) then
    redis.call('SET', F, fs, 'PX', fence_memory)
  end
  v = {}
end
if aux then
  return aux
end
local s, us = now_parts()
local now = s * 1000 + math.floor(us / 1000)
purge(RL, RC, Q, QE, now)
local writer = v[2]
local n = tonumber(redis.call('HGET', RC, owner) or '-1')
if n >= 1 then
  return held(redis.call('HINCRBY', RC, owner, 1), '')
end
if n == 0 or writer and writer == ARGV[5] or not writer and not writer_queued(Q) then
  -- A hand-over claimed, a writer reading, or a free lock: a fresh lease.
  redis.call('HSET', RC, owner, 1)
  redis.call('ZADD', RL, now + ttl, owner)
  extend(RL, ttl)
  extend(RC, ttl)
  keep_kind(W, RL, now)
  redis.call('ZREM', Q, waiter)
  redis.call('ZREM', QE, waiter)
  return held(1, '')
end
local added = 0
if mark > 0 then
  added = enqueue(Q, QE, waiter, s, us, now, mark)
  note_queued(W, CH, from, writer, v[3], v[4], added, false)
end
local left
if writer then
  left = redis.call('PTTL', W)
else
  local first = redis.call('ZRANGE', Q, 0, 0)[1]
  left = first and tonumber(redis.call('ZSCORE', QE, first)) - now
end
return busy(left, writer, '', added)
