-- latch_count_down: count a latch down by one.
--
-- KEYS[1]  the latch key (a hash: 'count', and 'gen', bumped at each zero)
-- KEYS[2]  the latch's channel
-- ARGV[1]  the Client's ID, for the release message
--
-- Returns the count after the call. At zero the count is removed, so that
-- the latch can be set again, the generation is bumped, so that an Await
-- that slept through a quick reset still sees that zero was reached, and
-- every waiter is woken. A latch at zero stays at zero. A key of another
-- type fails with WRONGTYPE.
if redis.call('HEXISTS', KEYS[1], 'count') == 0 then
  return 0
end
local n = redis.call('HINCRBY', KEYS[1], 'count', -1)
if n > 0 then
  return n
end
redis.call('HDEL', KEYS[1], 'count')
redis.call('HINCRBY', KEYS[1], 'gen', 1)
redis.call('PUBLISH', KEYS[2], ARGV[1] .. '|0|')
return 0
