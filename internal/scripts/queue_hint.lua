-- queue_hint: the queue hint of the locks that cohort, included by the
-- scripts that queue for them (excl_try.lua, rw_try_write.lua and
-- rw_try_read.lua), after lib.lua; not a script of its own. See the
-- engine's cohort.go.
--
-- A lock's main key (K; an RWMutex's W) keeps, while held, a field q that
-- says who queued since the holder's grant: absent, nobody (a quiet grant:
-- excl_try's hot path, or rw_try_write's grant with nobody queued, which
-- answer with the token alone); 'c', only cohorting waiters of the
-- holder's Client, which its cohort serves itself; '1', anyone else, or
-- the grant itself was not quiet. The first other waiter since a quiet
-- grant that reserved tokens is announced ('<from>|0|q'), so that a cohort
-- holding past its time bound knows that another waits.

-- A waiter just queued (added: 1 when anew) on K while holder holds it,
-- where the caller read K's q as hint and its reservation x as reserving:
-- record it in the hint, and announce it on CH when it is the first since
-- a quiet grant that reserved tokens, unless own (a cohorting waiter of
-- the holder's Client, which the cohort serves itself). Nothing while
-- nobody holds.
local function note_queued(K, CH, from, holder, hint, reserving, added, own)
  if holder and (not hint or hint == 'c' and not own) then
    redis.call('HSET', K, 'q', own and 'c' or '1')
    if added == 1 and reserving and not own then
      redis.call('PUBLISH', CH, msg_wake(from, 0, 'q'))
    end
  end
end
