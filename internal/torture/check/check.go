// Package check reads a torture history (package history) and says whether
// dlock kept its promises in it. Check runs every checker below over one
// merged, time-sorted history and returns a Report.
//
// # Holds
//
// Every checker but the latch's works on holds. A hold starts with an OK
// acquisition (Lock, TryLock, RLock, TryRLock, Acquire, TryAcquire;
// Election's Campaign is Lock) and belongs to a lock space and name
// (history.Space). A MultiLock's OK Lock starts one hold per member name in
// the mutex space; its Unlock or Lost ends them all. After a Point Handed
// the hold continues under NewHolder; until the new holder's Point Claimed
// (its ExtendRef succeeded) nobody acts on it, so a Lost that comes before
// the claim ends the hold at [Handed, Lost], as a release of unknown
// outcome would. Reentrant and RW holds are counted per
// owner (an RW owner has a read hold and a write hold): a hold runs from the
// acquisition that takes the count from 0 to the release that takes it back
// to 0.
//
// A hold ends at the earliest of:
//   - its release: the interval [release invoke, release completion] when
//     the release completed OK; [release invoke, the hold's Lost, or +inf]
//     when it completed Info (or never completed); a release that completed
//     Fail (the hold was already gone) leaves the ending to the hold's Lost
//     point, or, when none comes before the owner's next hold, ends it at
//     [release invoke, release invoke];
//   - a Point Lost for the holder (RW: Read picks the side): [T, T];
//   - exemption "paused": a nemesis Pause of a process of the hold (the
//     acquiring process, and after a hand-over the process that recorded
//     Handed) starting while the hold may be active, that is from the
//     acquisition's invocation until the end above starts. The hold ends at
//     the pause for the models: [T, T], or [T, acquisition completion] when
//     the pause came while the acquisition was pending (it may have taken
//     the lock before or after the pause);
//   - exemption "dataloss": likewise for KillRedis (spaces mutex,
//     reentrant, rw, semaphore, latch, election) and FailoverStart (space
//     sentinel). Faults of the Redlock masters exempt nothing: Redlock
//     tolerates a minority failure.
//
// Holds still active when the history ends end at +inf.
//
// Further rules where the history alone is ambiguous:
//   - a release that never completed counts as one of unknown outcome;
//   - a Lost recorded before its hold's acquisition completed (the two
//     recorded concurrently) ends that hold (mutex-like spaces, where a
//     holder names one hold);
//   - a reentrant or RW write owner that re-enters, with the same token, a
//     hold it was told it lost or whose release failed or had an unknown
//     outcome: the server still had the hold (only a re-entry repeats a
//     token), so the hold goes on; after an exemption, a fresh grant (count
//     1 or a new token) ends the exempted hold instead;
//   - acquisitions that failed or whose outcome is unknown start no hold.
//
// # Checkers
//
//  1. linearizability: porcupine, one partition per (space, name), with a
//     mutex-with-tokens model (mutex, redlock, sentinel, election), a
//     reentrant model, a reader/writer model and a latch model (see
//     models.go). Tokens must rise: an acquisition that takes a free lock
//     carries a token above every earlier one, also across data loss (dlock
//     tokens follow the server's clock). Latch operations of unknown
//     outcome may or may not take effect, until the end. A porcupine
//     timeout is a failure. The search is helped, without changing its
//     verdict, by moving the calls of blocked acquisitions up to when the
//     token order lets them be placed (tighten.go).
//  2. lost-before-acquired: in the exclusive spaces, no hold B of another
//     holder completes its acquisition while a hold A is active (between
//     A's acquisition completion and the start of A's untruncated end).
//     Exempt (counted, not violations): "paused past lease" when a process
//     of A was paused between A's acquisition invocation and B's
//     completion, or a process of B was paused between B's invocation and
//     A's completion (B may have taken the lock first and reported late);
//     "data loss" when a data-loss event of the space falls between the
//     earlier of the two invocations and B's completion.
//  3. semaphore: at every instant the permits held on a semaphore name
//     (acquisition completion to end start, exemptions applied) sum to at
//     most the latest Setting "total:<name>", and FinalAvailable equals the
//     final total. A semaphore without a total is a violation (it cannot be
//     checked).
//  4. election-terms: the tokens of an election's terms, in the order their
//     Campaigns completed, strictly rise.
//  5. fencing: no guard admits a token below one it had admitted before the
//     write was invoked. Exempt: pairs with a data-loss event (KillRedis or
//     FailoverStart, whatever the space: the guard's store may be the main
//     Redis) between the first write's completion and the second's.
//  6. liveness: every invocation completes; no blocking acquisition waits
//     on a free lock (no hold, no pending MultiLock over the name, no Info
//     acquisition's possible hold) longer than Lease+Period outside fault
//     windows ([start, end+Lease+Period] of any fault, anywhere); no Point
//     KeyWithoutTTL.
package check

import (
	"sort"
	"time"

	"github.com/dlock-go/dlock/internal/torture/history"
)

// Options tune Check.
type Options struct {
	// Lease is the lease of watchdog-renewed holds in the run. A Point
	// Setting "lease" (N ms) in the history wins. Without either, 30s
	// (dlock's default watchdog timeout).
	Lease time.Duration
	// Period is the renewal period (Setting "period" wins); default Lease/3.
	Period time.Duration
	// PorcupineTimeout bounds the linearizability search of each
	// partition; default 30s. A search that times out is a violation.
	PorcupineTimeout time.Duration
	// OutDir, when not empty, receives a porcupine visualization (HTML) of
	// every partition found not linearizable.
	OutDir string
}

// Check runs every checker over evs, a merged history sorted by T (it is
// sorted again, stably, if it is not).
func Check(evs []history.Event, o Options) Report {
	if !sort.SliceIsSorted(evs, func(i, j int) bool { return evs[i].T < evs[j].T }) {
		evs = append([]history.Event(nil), evs...)
		history.Sort(evs)
	}
	r := newRun(evs, o)
	r.buildHolds()
	rep := Report{
		Events: len(evs),
		Span:   time.Duration(r.tEnd - r.t0),
		Lease:  r.lease,
		Period: r.period,
	}
	rep.Checkers = []Result{
		r.checkLinearizable(),
		r.checkLost(&rep),
		r.checkSemaphores(),
		r.checkElection(),
		r.checkFencing(),
		r.checkLiveness(&rep),
	}
	r.count(&rep)
	return rep
}
