-- latch_common: the CountDownLatch, included by the latch_*.lua scripts;
-- not a script of its own.
--
-- A latch named n is one hash, L = p{n}: k: 'latch'; count: the count
-- (absent at zero); gen: the generation, which a TrySetCount that creates
-- the latch starts at the server's clock in microseconds, and which is
-- bumped each time the count reaches zero; x: the idle expiry in ms, if
-- any. An Await compares the generation it first read with the current
-- one: a zero reached meanwhile bumped it, and a latch deleted (or expired)
-- and set again is a new incarnation whose generation no earlier one had,
-- so either shows even when the latch is counting again by the time Await
-- looks. (As fencing tokens do, this rests on the server's clock not
-- stepping back.) It publishes on p{n}:ch. With
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
