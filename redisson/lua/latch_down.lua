-- latch_down: Redisson's RCountDownLatch.countDown (docs/redisson.md §6.2).
--
-- KEYS[1] the latch <name>
-- KEYS[2] the channel redisson_countdownlatch__channel__{<name>}
-- ARGV[1] PUBLISH or SPUBLISH
-- returns: the count left, 0 once it reached zero (the key is then deleted
--          and 0, the zero-count message, published); -1 for a latch that
--          did not exist (nothing is published).
-- errors:  DLOCK_KIND when the value is not an integer; WRONGTYPE when the
--          key is no string. Nothing is written then.
local old = redis.call('GET', KEYS[1])
if old ~= false and tonumber(old) == nil then
  return redis.error_reply('DLOCK_KIND ' .. KEYS[1] .. ' a string that is not a count')
end
local v = redis.call('DECR', KEYS[1])
if v <= 0 then
  redis.call('DEL', KEYS[1])
end
if v == 0 then
  redis.call(ARGV[1], KEYS[2], 0)
end
return v
