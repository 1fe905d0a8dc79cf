-- cohort_end: the end of a lock cohort in Redis, included by the releasing
-- scripts of the locks that cohort (excl_unlock.lua, rw_unlock_write.lua),
-- after lib.lua; not a script of its own. See the engine's cohort.go.

-- The end of a cohort, for the releasing scripts (excl_unlock, and
-- rw_unlock_write): their ARGV[5..] are the waiting mark lease in ms, the
-- number n of places then listed, which the cohort served locally, and
-- after them the cohort's local waiters. drop_served takes the served
-- places out of the queue, and returns the index in ARGV of the first
-- local waiter (past #ARGV when none), or 0 without cohort arguments.
local function drop_served(Q, QE)
  if #ARGV < 5 then
    return 0
  end
  local last = 6 + tonumber(ARGV[6])
  for i = 7, last do
    redis.call('ZREM', Q, ARGV[i])
    redis.call('ZREM', QE, ARGV[i])
  end
  return last + 1
end

-- queue_local queues the cohort's local waiters, ARGV[first..], in their
-- order, behind those queued (and so ahead of the releasing caller, should
-- it lock again), with marks of ARGV[5] ms. Returns whether it queued any.
local function queue_local(Q, QE, first)
  if first == 0 or first > #ARGV then
    return false
  end
  local mark = tonumber(ARGV[5])
  local s, us = now_parts()
  local base = s * 1000000 + us
  local now = s * 1000 + math.floor(us / 1000)
  for i = first, #ARGV do
    redis.call('ZADD', Q, 'NX', string.format('%.0f', base + i - first), ARGV[i])
    redis.call('ZADD', QE, now + mark, ARGV[i])
  end
  extend(Q, mark)
  extend(QE, mark)
  return true
end
