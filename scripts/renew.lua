-- renew: extend many watchdog leases in one call. It never re-creates a key.
--
-- KEYS[i]    a held lock key (all KEYS in one hash slot on Redis Cluster)
-- ARGV[1]    the new lease in milliseconds
-- ARGV[i+1]  how KEYS[i] is held: a one-letter kind followed by an ID
--              's<token>'  a string lock whose value must equal <token>
--              'h<owner>'  a hash lock in which field <owner> must exist
--
-- Returns an array: element i is 1 when KEYS[i] was renewed, 0 when the hold
-- is gone (or the key has another type). One bad key never fails the batch.
local out = {}
for i, key in ipairs(KEYS) do
  local spec = ARGV[i + 1]
  local kind, id = string.sub(spec, 1, 1), string.sub(spec, 2)
  local held = false
  if kind == 's' then
    held = redis.pcall('GET', key) == id
  elseif kind == 'h' then
    held = redis.pcall('HEXISTS', key, id) == 1
  end
  if held then
    redis.call('PEXPIRE', key, ARGV[1])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
