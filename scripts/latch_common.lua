-- latch_common: the CountDownLatch, included by the latch_*.lua scripts;
-- not a script of its own.
--
-- A latch named n is one hash, L = p{n}: k: 'latch'; count: the count
-- (absent at zero); gen: bumped each time the count reaches zero, so that
-- an Await that slept through a quick reset still sees that zero was
-- reached; x: the idle expiry in ms, if any. It publishes on p{n}:ch. With
-- an idle expiry, every script that touches the latch sets its expiry to at
-- least x ms; without one it persists.

--#include lib.lua

local function latch_state(L)
  return main_key(L, 'latch', 'count', 'gen', 'x')
end

local function touch(L, idle)
  idle = tonumber(idle or '')
  if idle and idle > 0 and redis.call('EXISTS', L) == 1 then
    extend(L, idle)
  end
end
