-- fence_write: one write to a data key, done only if the writer's fencing
-- token is at least the highest token admitted for that key so far.
--
-- KEYS[1]   the key's fence record: a string holding the highest token
--           admitted for the key, in decimal; absent before the first write.
--           It never expires.
-- KEYS[2]   the data key, in the same hash slot as KEYS[1]
-- ARGV[1]   the writer's token, in decimal without leading zeros, not "0"
-- ARGV[2]   the write: SET, HSET or DEL
-- ARGV[3..] its arguments after the key
--
-- Returns {1} when the token is admitted: the write ran, and the record now
-- holds ARGV[1] (raised to it, or already equal). Returns {0, record} when
-- ARGV[1] is lower than the record: nothing changed. When the write itself
-- fails (WRONGTYPE, a wrong number of arguments) its error is returned and
-- nothing changed either, since the record is raised only after the write
-- succeeded. A record of another type fails with WRONGTYPE, changing nothing.

-- Tokens go beyond 2^53, where Lua's numbers lose precision, so they are
-- compared as decimal strings: a longer one is greater, and digits of equal
-- length order as strings do.
local function lower(a, b)
  if #a ~= #b then
    return #a < #b
  end
  return a < b
end

local token = ARGV[1]
local admitted = redis.call('GET', KEYS[1])
if admitted and lower(token, admitted) then
  return {0, admitted}
end
local reply = redis.pcall(ARGV[2], KEYS[2], unpack(ARGV, 3))
if type(reply) == 'table' and reply.err then
  return reply
end
if admitted ~= token then
  redis.call('SET', KEYS[1], token)
end
return {1}
