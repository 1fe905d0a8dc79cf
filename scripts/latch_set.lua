-- latch_set: set a latch's count unless it is set.
--
-- KEYS[1]  the latch key
-- ARGV[1]  the count (>= 1)
--
-- Returns 1 when set, 0 when the latch was already counting. A key of
-- another type fails with WRONGTYPE and is left untouched.
local t = redis.call('TYPE', KEYS[1])['ok']
if t == 'none' then
  redis.call('SET', KEYS[1], ARGV[1])
  return 1
end
if t ~= 'string' then
  return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
end
return 0
