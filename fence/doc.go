// Package fence guards resources against writers whose lock has expired
// without their knowing: the resource side of fencing tokens.
//
// # Why a lock is not enough
//
// A lease lock ends when its lease runs out, whether or not its holder has
// noticed. Kleppmann's scenario ("How to do distributed locking", 2016):
// client 1 takes the lock and starts to write; a GC pause (or SIGSTOP, a
// swapped-out page, a stalled network) freezes it for longer than its lease;
// the lease expires and client 2 takes the lock and writes; client 1 wakes
// up, still believing it holds the lock, and writes too, overwriting client
// 2's work. Nothing on the locking side can stop that last write: client 1
// checked its lock, and the pause came after the check. Only the resource
// can, because only the resource sees the write arrive.
//
// # Fencing tokens
//
// Every acquisition of a dlock lock comes with a token, a uint64 that is
// never 0 and is greater than every token issued earlier for the same lock
// name. The holder sends its token with each write, and the resource keeps,
// for each resource name, the highest token it has admitted. A guard admits
// a write only if its token is at least that highest one, and then records
// the token. In the scenario, client 2's write (token 34) raises the record
// to 34, and client 1's late write (token 33) is refused with ErrStale.
//
// A token equal to the record is admitted again, so one holder can write as
// many times as it likes during its hold. A token of 0 is never valid
// (ErrInvalid): a writer that forgot its token must not pass as the oldest.
//
// In every guard the check and the write are one atomic step: a Redis
// script, a SQL statement or transaction, or a critical section. A guard
// that checked and then wrote in two steps would only move the race.
//
// The guards:
//
//   - Redis: a write to a Redis key (SET, HSET, DEL) in one script run, one
//     round trip, with the key's fence record in the same cluster slot.
//   - SQL: a PostgreSQL transaction (through database/sql) that first raises
//     the resource's row in a fences table, and commits only with it.
//   - Row: a single UPDATE of a row that carries its own fence column.
//   - Gate: in a Go process that receives writes tagged with tokens.
//
// Use one token source per resource: the tokens of one lock name. Tokens of
// two different locks are not ordered against each other, and a resource
// written under both would refuse writes at random.
//
// # What fencing does not do
//
// A refused write is refused for good: the writer has lost its lock and
// should stop, not retry with the same token. Fencing keeps a stale writer
// from overwriting newer state; it does not make a lock exclusive (two
// holders may both be admitted, in token order), and it protects only
// writes that go through a guard.
package fence
