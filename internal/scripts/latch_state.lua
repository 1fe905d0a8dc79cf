-- latch_state: a latch's count and generation (includes latch_common.lua).
-- It changes nothing.
--
-- KEYS[1]  the latch key (see latch_common.lua)
--
-- Returns {count (0 when not counting), generation}. A key of another kind
-- fails with DLOCK_KIND.
--#include latch_common.lua
local v, bad = latch_state(KEYS[1])
if bad then
  return bad
end
return {tonumber(v[2] or '0'), tonumber(v[3] or '0')}
