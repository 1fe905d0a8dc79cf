-- latch_set: set a latch's count unless it is counting.
--
-- KEYS[1]  the latch key (a hash: 'count', and 'gen', bumped at each zero)
-- ARGV[1]  the count (>= 1)
--
-- Returns 1 when set, 0 when the latch was already counting. A key of
-- another type fails with WRONGTYPE and is left untouched.
if redis.call('HEXISTS', KEYS[1], 'count') == 1 then
  return 0
end
redis.call('HSET', KEYS[1], 'count', ARGV[1])
return 1
