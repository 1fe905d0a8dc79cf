-- latch_count_down: count a latch down by one.
--
-- KEYS[1]  the latch key (a string holding the count)
-- KEYS[2]  the latch's channel
-- ARGV[1]  the Client's ID, for the release message
--
-- Returns the count after the call. At zero the key is deleted, so that the
-- latch can be set again, and every waiter is woken. A latch already at zero
-- (no key) stays at zero. A key of another type fails with WRONGTYPE.
local v = redis.call('GET', KEYS[1])
if not v then
  return 0
end
local n = redis.call('DECR', KEYS[1])
if n > 0 then
  return n
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', KEYS[2], ARGV[1] .. '|0|')
return 0
