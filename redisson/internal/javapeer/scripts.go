package javapeer

import "github.com/redis/go-redis/v9"

// The scripts below are the peer's own transcription of what Redisson 4.7.0
// sends (docs/redisson.md §3–§7), with Redisson's KEYS and ARGV order and
// its unlock latch. They are written apart from package redisson's scripts
// on purpose: each side's tests check the other's.

// tryLock: KEYS name; ARGV lease, field. nil = acquired, else PTTL.
var tryLock = redis.NewScript(`
if (redis.call('exists', KEYS[1]) == 0) or (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
return redis.call('pttl', KEYS[1])`)

// tryLockFenced: KEYS name, token key; ARGV lease, field.
// {-1, token} = acquired, else {PTTL, -1}.
var tryLockFenced = redis.NewScript(`
if (redis.call('exists', KEYS[1]) == 0) or (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then
  local t = redis.call('incr', KEYS[2])
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return {-1, t}
end
return {redis.call('pttl', KEYS[1]), -1}`)

// unlock: KEYS name, channel, latch; ARGV 0, lease, field, pubcmd, latchTTL.
var unlock = redis.NewScript(`
local v = redis.call('get', KEYS[3])
if v ~= false then return tonumber(v) end
if redis.call('hexists', KEYS[1], ARGV[3]) == 0 then return nil end
local c = redis.call('hincrby', KEYS[1], ARGV[3], -1)
if c > 0 then
  redis.call('pexpire', KEYS[1], ARGV[2])
  redis.call('set', KEYS[3], 0, 'px', ARGV[5])
  return 0
end
redis.call('del', KEYS[1])
redis.call(ARGV[4], KEYS[2], ARGV[1])
redis.call('set', KEYS[3], 1, 'px', ARGV[5])
return 1`)

// forceUnlock: KEYS name, channel; ARGV 0, pubcmd.
var forceUnlock = redis.NewScript(`
if redis.call('del', KEYS[1]) == 1 then
  redis.call(ARGV[2], KEYS[2], ARGV[1])
  return 1
end
return 0`)

// renew: KEYS names; ARGV[1] lease, ARGV[i+1] field of KEYS[i].
var renew = redis.NewScript(`
local r = {}
for i = 1, #KEYS do
  if redis.call('hexists', KEYS[i], ARGV[i + 1]) == 1 then
    redis.call('pexpire', KEYS[i], ARGV[1])
    r[i] = 1
  else
    r[i] = 0
  end
end
return r`)

// readLock: KEYS name, timeout prefix; ARGV lease, field, write field.
var readLock = redis.NewScript(`
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  redis.call('hset', KEYS[1], 'mode', 'read')
  redis.call('hset', KEYS[1], ARGV[2], 1)
  redis.call('set', KEYS[2] .. ':1', 1)
  redis.call('pexpire', KEYS[2] .. ':1', ARGV[1])
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
if (mode == 'read') or (mode == 'write' and redis.call('hexists', KEYS[1], ARGV[3]) == 1) then
  local ind = redis.call('hincrby', KEYS[1], ARGV[2], 1)
  local key = KEYS[2] .. ':' .. ind
  redis.call('set', key, 1)
  redis.call('pexpire', key, ARGV[1])
  local remain = redis.call('pttl', KEYS[1])
  redis.call('pexpire', KEYS[1], math.max(remain, ARGV[1]))
  return nil
end
return redis.call('pttl', KEYS[1])`)

// readUnlock: KEYS name, channel, timeout prefix, key prefix, latch;
// ARGV 0, field, pubcmd, latchTTL.
var readUnlock = redis.NewScript(`
local v = redis.call('get', KEYS[5])
if v ~= false then return tonumber(v) end
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  redis.call(ARGV[3], KEYS[2], ARGV[1])
  redis.call('set', KEYS[5], 1, 'px', ARGV[4])
  return nil
end
if redis.call('hexists', KEYS[1], ARGV[2]) == 0 then return nil end
local counter = redis.call('hincrby', KEYS[1], ARGV[2], -1)
if counter == 0 then redis.call('hdel', KEYS[1], ARGV[2]) end
redis.call('del', KEYS[3] .. ':' .. (counter + 1))
if redis.call('hlen', KEYS[1]) > 1 then
  local maxRemain = -3
  local keys = redis.call('hkeys', KEYS[1])
  for n, key in ipairs(keys) do
    local c = tonumber(redis.call('hget', KEYS[1], key))
    if type(c) == 'number' then
      for i = c, 1, -1 do
        local remain = redis.call('pttl', KEYS[4] .. ':' .. key .. ':rwlock_timeout:' .. i)
        maxRemain = math.max(remain, maxRemain)
      end
    end
  end
  if maxRemain > 0 then
    redis.call('pexpire', KEYS[1], maxRemain)
    redis.call('set', KEYS[5], 0, 'px', ARGV[4])
    return 0
  end
  if mode == 'write' then
    redis.call('set', KEYS[5], 0, 'px', ARGV[4])
    return 0
  end
end
redis.call('del', KEYS[1])
redis.call(ARGV[3], KEYS[2], ARGV[1])
redis.call('set', KEYS[5], 1, 'px', ARGV[4])
return 1`)

// writeLock: KEYS name; ARGV lease, write field.
var writeLock = redis.NewScript(`
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  redis.call('hset', KEYS[1], 'mode', 'write')
  redis.call('hset', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
if mode == 'write' and redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  local t = redis.call('pttl', KEYS[1])
  redis.call('pexpire', KEYS[1], t + ARGV[1])
  return nil
end
return redis.call('pttl', KEYS[1])`)

// writeUnlock: KEYS name, channel, latch; ARGV 1, lease, write field,
// pubcmd, latchTTL.
var writeUnlock = redis.NewScript(`
local v = redis.call('get', KEYS[3])
if v ~= false then return tonumber(v) end
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  redis.call(ARGV[4], KEYS[2], ARGV[1])
  redis.call('set', KEYS[3], 1, 'px', ARGV[5])
  return nil
end
if mode == 'write' then
  if redis.call('hexists', KEYS[1], ARGV[3]) == 0 then return nil end
  local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1)
  if counter > 0 then
    redis.call('pexpire', KEYS[1], ARGV[2])
    redis.call('set', KEYS[3], 0, 'px', ARGV[5])
    return 0
  end
  redis.call('hdel', KEYS[1], ARGV[3])
  if redis.call('hlen', KEYS[1]) == 1 then
    redis.call('del', KEYS[1])
    redis.call(ARGV[4], KEYS[2], ARGV[1])
  else
    redis.call('hset', KEYS[1], 'mode', 'read')
  end
  redis.call('set', KEYS[3], 1, 'px', ARGV[5])
  return 1
end
return nil`)

// renewRead: KEYS name, key prefix; ARGV lease, field.
var renewRead = redis.NewScript(`
local c = redis.call('hget', KEYS[1], ARGV[2])
if c == false then return 0 end
for i = tonumber(c), 1, -1 do
  redis.call('pexpire', KEYS[2] .. ':' .. ARGV[2] .. ':rwlock_timeout:' .. i, ARGV[1])
end
redis.call('pexpire', KEYS[1], ARGV[1])
return 1`)

// semTryAcquire: KEYS name; ARGV permits.
var semTryAcquire = redis.NewScript(`
local value = redis.call('get', KEYS[1])
if (value ~= false and tonumber(value) >= tonumber(ARGV[1])) then
  redis.call('decrby', KEYS[1], ARGV[1])
  return 1
end
return 0`)

// semRelease: KEYS name, channel; ARGV permits, pubcmd.
var semRelease = redis.NewScript(`
local value = redis.call('incrby', KEYS[1], ARGV[1])
redis.call(ARGV[2], KEYS[2], value)`)

// semTrySet: KEYS name, channel; ARGV permits, pubcmd.
var semTrySet = redis.NewScript(`
local value = redis.call('get', KEYS[1])
if (value == false) then
  redis.call('set', KEYS[1], ARGV[1])
  redis.call(ARGV[2], KEYS[2], ARGV[1])
  return 1
end
return 0`)

// latchTrySet: KEYS name, channel; ARGV 1, count, pubcmd.
var latchTrySet = redis.NewScript(`
if redis.call('exists', KEYS[1]) == 0 then
  redis.call('set', KEYS[1], ARGV[2])
  redis.call(ARGV[3], KEYS[2], ARGV[1])
  return 1
end
return 0`)

// latchCountDown: KEYS name, channel; ARGV 0, pubcmd.
var latchCountDown = redis.NewScript(`
local v = redis.call('decr', KEYS[1])
if v <= 0 then redis.call('del', KEYS[1]) end
if v == 0 then redis.call(ARGV[2], KEYS[2], ARGV[1]) end`)
