-- latch_set: Redisson's RCountDownLatch.trySetCount (docs/redisson.md §6.2).
--
-- KEYS[1] the latch <name>: a string, the count left
-- KEYS[2] the channel redisson_countdownlatch__channel__{<name>}
-- ARGV[1] the count, > 0
-- ARGV[2] PUBLISH or SPUBLISH
-- errors:  DLOCK_KIND when the key is no string.
-- returns: 1 when set (and 1, the new-count message, published), 0 when the
--          latch already existed.
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'none' then
  if t ~= 'string' then
    return redis.error_reply('DLOCK_KIND ' .. KEYS[1] .. ' a ' .. t .. ', not a latch')
  end
  return 0
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call(ARGV[2], KEYS[2], 1)
return 1
