package check

import (
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/dlock-go/dlock/internal/torture/history"
)

// hist builds synthetic histories. Times are in milliseconds.
type hist struct {
	evs []history.Event
	ids map[int]int64
}

func newHist() *hist { return &hist{ids: map[int]int64{}} }

func ms(t float64) int64 { return int64(t * 1e6) }

// op records an operation of process p invoked at t1 and completed with k
// at t2; e gives its fields (on both events; the completion's Tok, Toks and
// N only).
func (h *hist) op(p int, t1, t2 float64, k history.Kind, e history.Event) {
	h.ids[p]++
	inv := e
	inv.T, inv.Proc, inv.ID, inv.Kind = ms(t1), p, h.ids[p], history.Invoke
	inv.Tok, inv.Toks, inv.B = 0, nil, false
	if e.F != history.Acquire && e.F != history.TryAcquire && e.F != history.SetCount && e.F != history.Release {
		inv.N = 0
	}
	if e.F == history.Write {
		inv.Tok = e.Tok
	}
	done := e
	done.T, done.Proc, done.ID, done.Kind = ms(t2), p, h.ids[p], k
	h.evs = append(h.evs, inv, done)
}

// pending records an invocation that never completes.
func (h *hist) pending(p int, t float64, e history.Event) {
	h.ids[p]++
	e.T, e.Proc, e.ID, e.Kind = ms(t), p, h.ids[p], history.Invoke
	h.evs = append(h.evs, e)
}

func (h *hist) point(p int, t float64, e history.Event) {
	e.T, e.Proc, e.Kind = ms(t), p, history.Point
	h.evs = append(h.evs, e)
}

func (h *hist) nem(t float64, f, target string) {
	h.point(-1, t, history.Event{Prim: history.Nemesis, F: f, Target: target})
}

func (h *hist) setting(t float64, name string, n int64) {
	h.point(-1, t, history.Event{Prim: history.Nemesis, F: history.Setting, Name: name, N: n})
}

func (h *hist) events() []history.Event {
	evs := append([]history.Event(nil), h.evs...)
	history.Sort(evs)
	return evs
}

// lock and unlock are a mutex hold's two operations.
func (h *hist) lock(p int, t1, t2 float64, prim, name, holder string, tok uint64) {
	h.op(p, t1, t2, history.OK, history.Event{Prim: prim, F: history.Lock, Name: name, Holder: holder, Tok: tok})
}

func (h *hist) unlock(p int, t1, t2 float64, k history.Kind, prim, name, holder string) {
	h.op(p, t1, t2, k, history.Event{Prim: prim, F: history.Unlock, Name: name, Holder: holder})
}

func (h *hist) lost(p int, t float64, prim, name, holder string) {
	h.point(p, t, history.Event{Prim: prim, F: history.Lost, Name: name, Holder: holder})
}

var opts = Options{Lease: 1000 * time.Millisecond, Period: 300 * time.Millisecond, PorcupineTimeout: 10 * time.Second}

func check(t *testing.T, h *hist) Report {
	t.Helper()
	rep := Check(h.events(), opts)
	t.Log("\n" + rep.String())
	return rep
}

// wantOK asserts the report is clean and the named checkers checked
// something.
func wantOK(t *testing.T, rep Report, checkers ...string) {
	t.Helper()
	if !rep.OK() {
		t.Fatalf("want no violation, got:\n%s", strings.Join(rep.Violations(), "\n"))
	}
	for _, c := range checkers {
		if r := rep.Result(c); r == nil || r.Checked == 0 {
			t.Errorf("checker %s checked nothing", c)
		}
	}
}

// wantViolation asserts the named checkers (and only they) found
// violations, each mentioning all of the given words.
func wantViolation(t *testing.T, rep Report, checker string, words ...string) {
	t.Helper()
	r := rep.Result(checker)
	if r == nil || r.OK() {
		t.Fatalf("want a %s violation, got none:\n%s", checker, rep)
	}
	for _, w := range words {
		found := false
		for _, v := range r.Violations {
			found = found || strings.Contains(v.String(), w)
		}
		if !found {
			t.Errorf("no %s violation mentions %q: %v", checker, w, r.Violations)
		}
	}
	if !strings.Contains(rep.String(), "VIOLATION") {
		t.Errorf("String does not list the violation")
	}
}

func exempt(rep Report, checker, what string) int {
	for _, c := range rep.Result(checker).Exempt {
		if strings.Contains(c.What, what) {
			return c.Count
		}
	}
	return 0
}

func TestMutexSequentialOK(t *testing.T) {
	h := newHist()
	h.lock(0, 0, 1, history.Mutex, "a", "h1", 10)
	h.op(1, 0.5, 2.5, history.OK, history.Event{Prim: history.Mutex, F: history.Lock, Name: "a", Holder: "h2", Tok: 11}) // waits
	h.op(2, 0.7, 0.8, history.Fail, history.Event{Prim: history.Mutex, F: history.TryLock, Name: "a", Holder: "h3"})
	h.unlock(0, 2, 2.2, history.OK, history.Mutex, "a", "h1")
	h.lost(1, 4, history.Mutex, "a", "h2")
	h.unlock(1, 4.5, 4.6, history.Fail, history.Mutex, "a", "h2") // ErrLost after the Lost
	h.lock(2, 3, 5, history.MutexNoCohort, "a", "h4", 12)
	h.unlock(2, 6, 7, history.OK, history.MutexNoCohort, "a", "h4")
	rep := check(t, h)
	wantOK(t, rep, Linearizability, LostBeforeAcquired, Liveness)
	if rep.LostLead.N != 1 || rep.LostLead.Min != time.Millisecond {
		t.Errorf("lost lead = %v, want 1ms once", rep.LostLead)
	}
}

// overlap: h2 acquires while h1 still holds and is never told.
func overlap(h *hist) {
	h.lock(0, 0, 1, history.Mutex, "a", "h1", 1)
	h.lock(1, 0.5, 3, history.Mutex, "a", "h2", 2)
	h.unlock(0, 5, 6, history.OK, history.Mutex, "a", "h1")
	h.unlock(1, 7, 8, history.OK, history.Mutex, "a", "h2")
}

func TestMutexOverlapViolation(t *testing.T) {
	h := newHist()
	overlap(h)
	rep := check(t, h)
	wantViolation(t, rep, Linearizability, "not linearizable", "cannot place")
	wantViolation(t, rep, LostBeforeAcquired, "h1", "h2")
}

func TestMutexOverlapPausedExempt(t *testing.T) {
	h := newHist()
	overlap(h)
	h.nem(1.5, history.Pause, "0")
	h.nem(4, history.Resume, "0")
	rep := check(t, h)
	wantOK(t, rep, Linearizability, LostBeforeAcquired)
	if exempt(rep, LostBeforeAcquired, "paused") != 1 || exempt(rep, Linearizability, "pause") != 1 {
		t.Errorf("want the pair and the hold exempt as paused")
	}
}

func TestMutexOverlapPausedWhileAcquiringExempt(t *testing.T) {
	// h2 took the lock first, was paused before its Lock returned, and its
	// lease ran out: h1 acquired; h2 reported late.
	h := newHist()
	h.lock(1, 0, 6, history.Mutex, "a", "h2", 1)
	h.nem(0.5, history.Pause, "1")
	h.nem(5, history.Resume, "1")
	h.lock(0, 2, 3, history.Mutex, "a", "h1", 2)
	h.unlock(0, 7, 8, history.OK, history.Mutex, "a", "h1")
	h.unlock(1, 7, 7.5, history.Fail, history.Mutex, "a", "h2")
	rep := check(t, h)
	wantOK(t, rep, Linearizability, LostBeforeAcquired)
}

func TestMutexOverlapDataLossExempt(t *testing.T) {
	h := newHist()
	overlap(h)
	h.nem(2, history.KillRedis, "")
	h.nem(2.2, history.RestartRedis, "")
	rep := check(t, h)
	wantOK(t, rep, Linearizability, LostBeforeAcquired)
	if exempt(rep, LostBeforeAcquired, "data loss") != 1 {
		t.Errorf("want the pair exempt by data loss")
	}
}

func TestRedlockNotExemptByMasterFaults(t *testing.T) {
	h := newHist()
	h.lock(0, 0, 1, history.Redlock, "a", "h1", 1)
	h.nem(1.5, history.MasterKill, "0")
	h.lock(1, 0.5, 3, history.Redlock, "a", "h2", 2)
	h.unlock(0, 5, 6, history.OK, history.Redlock, "a", "h1")
	h.nem(7, history.MasterRestart, "0")
	rep := check(t, h)
	wantViolation(t, rep, LostBeforeAcquired, "redlock")
	wantViolation(t, rep, Linearizability, "redlock")
}

func TestTokensNotRising(t *testing.T) {
	h := newHist()
	h.lock(0, 0, 1, history.Sentinel, "a", "h1", 5)
	h.unlock(0, 2, 3, history.OK, history.Sentinel, "a", "h1")
	h.lock(1, 4, 5, history.Sentinel, "a", "h2", 5)
	h.unlock(1, 6, 7, history.OK, history.Sentinel, "a", "h2")
	rep := check(t, h)
	wantViolation(t, rep, Linearizability, "tok 5")
	if !rep.Result(LostBeforeAcquired).OK() {
		t.Errorf("no overlap here")
	}
}

func TestElectionTerms(t *testing.T) {
	h := newHist()
	h.lock(0, 0, 1, history.Election, "e", "c1", 7)
	h.unlock(0, 2, 3, history.OK, history.Election, "e", "c1")
	h.lock(1, 1, 4, history.Election, "e", "c2", 9)
	h.lost(1, 6, history.Election, "e", "c2")
	h.lock(2, 5, 7, history.Election, "e", "c3", 12)
	rep := check(t, h)
	wantOK(t, rep, ElectionTerms, Linearizability, LostBeforeAcquired)

	h.lock(0, 8, 9, history.Election, "f", "c4", 20)
	h.unlock(0, 10, 11, history.OK, history.Election, "f", "c4")
	h.lock(1, 12, 13, history.Election, "f", "c5", 19)
	rep = check(t, h)
	wantViolation(t, rep, ElectionTerms, "19", "20")
}

func TestMultiLockAndHandOver(t *testing.T) {
	h := newHist()
	h.op(0, 0, 1, history.OK, history.Event{Prim: history.MultiLock, F: history.Lock, Names: []string{"a", "b"}, Holder: "m1",
		Toks: map[string]uint64{"a": 3, "b": 8}})
	h.lock(1, 0.5, 4, history.Mutex, "a", "h1", 4) // waits for the MultiLock
	h.op(0, 2, 3, history.OK, history.Event{Prim: history.MultiLock, F: history.Unlock, Names: []string{"a", "b"}, Holder: "m1"})
	// b handed from p2 to p3, then released there.
	h.lock(2, 5, 6, history.HandOver, "b", "h2", 9)
	h.point(3, 7, history.Event{Prim: history.HandOver, F: history.Handed, Name: "b", Holder: "h2", NewHolder: "h3"})
	h.op(3, 8, 9, history.OK, history.Event{Prim: history.HandOver, F: history.Write, Name: "b", Holder: "h3", Tok: 9})
	h.unlock(3, 10, 11, history.OK, history.HandOver, "b", "h3")
	h.lock(1, 9.5, 12, history.Mutex, "b", "h4", 10)
	h.unlock(1, 13, 14, history.OK, history.Mutex, "b", "h4")
	h.unlock(1, 13, 14, history.OK, history.Mutex, "a", "h1")
	rep := check(t, h)
	wantOK(t, rep, Linearizability, LostBeforeAcquired, Fencing)

	// The MultiLock's Unlock before the Mutex got a: now it overlaps.
	h = newHist()
	h.op(0, 0, 1, history.OK, history.Event{Prim: history.MultiLock, F: history.Lock, Names: []string{"a", "b"}, Holder: "m1",
		Toks: map[string]uint64{"a": 3, "b": 8}})
	h.lock(1, 0.5, 2, history.Mutex, "a", "h1", 4)
	h.op(0, 3, 4, history.OK, history.Event{Prim: history.MultiLock, F: history.Unlock, Names: []string{"a", "b"}, Holder: "m1"})
	rep = check(t, h)
	wantViolation(t, rep, LostBeforeAcquired, "m1", "h1")
	wantViolation(t, rep, Linearizability, `"a"`)
}

func TestReentrant(t *testing.T) {
	h := newHist()
	re := func(p int, t1, t2 float64, f, owner string, tok uint64, n int64) {
		h.op(p, t1, t2, history.OK, history.Event{Prim: history.Reentrant, F: f, Name: "r", Holder: owner, Tok: tok, N: n})
	}
	re(0, 0, 1, history.Lock, "o1", 4, 1)
	re(0, 2, 3, history.Lock, "o1", 4, 2) // re-entry, same token
	re(1, 2.5, 8, history.Lock, "o2", 5, 1)
	re(0, 4, 5, history.Unlock, "o1", 0, 1)
	re(0, 6, 7, history.Unlock, "o1", 0, 0)
	re(1, 9, 10, history.Unlock, "o2", 0, 0)
	rep := check(t, h)
	wantOK(t, rep, Linearizability, LostBeforeAcquired)

	// A re-entry with another token.
	h = newHist()
	re(0, 0, 1, history.Lock, "o1", 4, 1)
	re(0, 2, 3, history.Lock, "o1", 6, 2)
	re(0, 4, 5, history.Unlock, "o1", 0, 1)
	re(0, 6, 7, history.Unlock, "o1", 0, 0)
	rep = check(t, h)
	wantViolation(t, rep, Linearizability, "lock(o1#0) tok 6")

	// Released once too early: o2 gets it while o1 still holds one level.
	h = newHist()
	re(0, 0, 1, history.Lock, "o1", 4, 1)
	re(0, 2, 3, history.Lock, "o1", 4, 2)
	re(0, 4, 5, history.Unlock, "o1", 0, 1)
	re(1, 3.5, 6, history.Lock, "o2", 5, 1)
	re(0, 7, 8, history.Unlock, "o1", 0, 0)
	rep = check(t, h)
	wantViolation(t, rep, Linearizability, "reentrant")
	wantViolation(t, rep, LostBeforeAcquired, "o1", "o2")
}

func TestRW(t *testing.T) {
	rw := func(h *hist, p int, t1, t2 float64, f, owner string, tok uint64, k history.Kind) {
		h.op(p, t1, t2, k, history.Event{Prim: history.RW, F: f, Name: "x", Holder: owner, Tok: tok})
	}
	h := newHist()
	rw(h, 0, 0, 1, history.RLock, "r1", 0, history.OK)
	rw(h, 1, 0.5, 1.5, history.RLock, "r2", 0, history.OK)
	rw(h, 1, 1.6, 1.7, history.Lock, "r2", 0, history.Fail) // ErrUpgrade
	rw(h, 2, 1, 6, history.Lock, "w1", 3, history.OK)       // waits for the readers
	rw(h, 0, 2, 3, history.RUnlock, "r1", 0, history.OK)
	rw(h, 1, 4, 5, history.RUnlock, "r2", 0, history.OK)
	rw(h, 2, 7, 8, history.RLock, "w1", 0, history.OK) // downgrade
	rw(h, 2, 9, 10, history.Unlock, "w1", 0, history.OK)
	rw(h, 0, 9.5, 11, history.RLock, "r1", 0, history.OK) // with w1's read hold
	h.point(2, 12, history.Event{Prim: history.RW, F: history.Lost, Name: "x", Holder: "w1", Read: true})
	rw(h, 2, 13, 14, history.RUnlock, "w1", 0, history.Fail)
	rw(h, 0, 15, 16, history.RUnlock, "r1", 0, history.OK)
	rep := check(t, h)
	wantOK(t, rep, Linearizability, LostBeforeAcquired)

	// A reader while a writer holds.
	h = newHist()
	rw(h, 2, 0, 1, history.Lock, "w1", 3, history.OK)
	rw(h, 0, 0.5, 2, history.RLock, "r1", 0, history.OK)
	rw(h, 2, 3, 4, history.Unlock, "w1", 0, history.OK)
	rw(h, 0, 5, 6, history.RUnlock, "r1", 0, history.OK)
	rep = check(t, h)
	wantViolation(t, rep, Linearizability, "rlock(r1#1)")
	wantViolation(t, rep, LostBeforeAcquired, "r1", "w1")
}

func latchOp(h *hist, p int, t1, t2 float64, f string, k history.Kind, n int64, b bool) {
	h.op(p, t1, t2, k, history.Event{Prim: history.Latch, F: f, Name: "l", N: n, B: b})
}

func TestLatch(t *testing.T) {
	h := newHist()
	latchOp(h, 0, 0, 1, history.SetCount, history.OK, 2, true)
	latchOp(h, 1, 0.5, 7, history.Await, history.OK, 0, false)
	latchOp(h, 2, 0.6, 0.8, history.Await, history.Fail, 0, false)  // ctx ended: no constraint
	latchOp(h, 0, 1.5, 1.6, history.SetCount, history.OK, 5, false) // not at zero: did not set
	latchOp(h, 0, 2, 3, history.CountDown, history.OK, 0, false)
	latchOp(h, 2, 4, 5, history.CountDown, history.Info, 0, false) // took effect, as the Await shows
	latchOp(h, 0, 8, 9, history.SetCount, history.OK, 3, true)
	latchOp(h, 0, 10, 11, history.Delete, history.OK, 0, true)
	latchOp(h, 1, 12, 13, history.Await, history.OK, 0, false)
	latchOp(h, 0, 14, 15, history.SetCount, history.OK, 1, true)
	h.nem(16, history.KillRedis, "")
	h.nem(17, history.RestartRedis, "")
	latchOp(h, 1, 18, 19, history.Await, history.OK, 0, false) // the count went with the data
	rep := check(t, h)
	wantOK(t, rep, Linearizability)

	// Await returns while the count is still 1.
	h = newHist()
	latchOp(h, 0, 0, 1, history.SetCount, history.OK, 2, true)
	latchOp(h, 0, 2, 3, history.CountDown, history.OK, 0, false)
	latchOp(h, 1, 4, 5, history.Await, history.OK, 0, false)
	rep = check(t, h)
	wantViolation(t, rep, Linearizability, "latch", "await")

	// SetCount that set while the count was not zero (no Delete between).
	h = newHist()
	latchOp(h, 0, 0, 1, history.SetCount, history.OK, 3, true)
	latchOp(h, 0, 10, 11, history.SetCount, history.OK, 2, true)
	rep = check(t, h)
	wantViolation(t, rep, Linearizability, "setcount(2)")
}

func sem(h *hist, p int, t1, t2 float64, f, permit string, n int64, k history.Kind) {
	h.op(p, t1, t2, k, history.Event{Prim: history.Semaphore, F: f, Name: "s", Holder: permit, N: n})
}

func TestSemaphore(t *testing.T) {
	h := newHist()
	h.setting(0, "total:s", 3)
	sem(h, 0, 1, 2, history.Acquire, "p1", 2, history.OK)
	sem(h, 1, 1, 3, history.Acquire, "p2", 1, history.OK)
	sem(h, 2, 1.5, 6, history.Acquire, "p3", 2, history.OK) // waits for p1
	sem(h, 0, 4, 5, history.Release, "p1", 2, history.OK)
	h.lost(1, 7, history.Semaphore, "s", "p2")
	sem(h, 3, 6.5, 8, history.Acquire, "p4", 1, history.OK)
	h.nem(9, history.Pause, "3")
	sem(h, 0, 9.5, 10, history.Acquire, "p5", 1, history.OK) // p4 exempt: paused
	h.nem(11, history.Resume, "3")
	sem(h, 2, 12, 13, history.Release, "p3", 2, history.OK)
	sem(h, 0, 12, 13, history.Release, "p5", 1, history.OK)
	sem(h, 3, 12, 13, history.Release, "p4", 1, history.Fail)
	h.point(-1, 20, history.Event{Prim: history.Nemesis, F: history.FinalAvailable, Name: "s", N: 3})
	rep := check(t, h)
	wantOK(t, rep, SemaphoreSweep)
	if exempt(rep, SemaphoreSweep, "pause") != 1 {
		t.Errorf("want p4 exempt")
	}

	// Over-subscribed: 2+2 permits of 3.
	h = newHist()
	h.setting(0, "total:s", 3)
	sem(h, 0, 1, 2, history.Acquire, "p1", 2, history.OK)
	sem(h, 1, 1, 3, history.Acquire, "p2", 2, history.OK)
	sem(h, 0, 4, 5, history.Release, "p1", 2, history.OK)
	sem(h, 1, 4, 5, history.Release, "p2", 2, history.OK)
	h.point(-1, 20, history.Event{Prim: history.Nemesis, F: history.FinalAvailable, Name: "s", N: 3})
	rep = check(t, h)
	wantViolation(t, rep, SemaphoreSweep, "4 permits held, total 3", "p1", "p2")

	// The total raised to 4 before the second acquisition: fine.
	h = newHist()
	h.setting(0, "total:s", 3)
	sem(h, 0, 1, 2, history.Acquire, "p1", 2, history.OK)
	h.setting(2.5, "total:s", 4)
	sem(h, 1, 1, 3, history.Acquire, "p2", 2, history.OK)
	sem(h, 0, 4, 5, history.Release, "p1", 2, history.OK)
	sem(h, 1, 4, 5, history.Release, "p2", 2, history.OK)
	h.point(-1, 20, history.Event{Prim: history.Nemesis, F: history.FinalAvailable, Name: "s", N: 4})
	rep = check(t, h)
	wantOK(t, rep, SemaphoreSweep)

	// A permit never given back.
	h = newHist()
	h.setting(0, "total:s", 3)
	sem(h, 0, 1, 2, history.Acquire, "p1", 1, history.OK)
	h.point(-1, 20, history.Event{Prim: history.Nemesis, F: history.FinalAvailable, Name: "s", N: 2})
	rep = check(t, h)
	wantViolation(t, rep, SemaphoreSweep, "not all back: 2 available after the run, total 3")
	if n := len(rep.Result(SemaphoreSweep).Violations); n != 1 {
		t.Errorf("want 1 violation, got %d", n)
	}
}

func TestFencing(t *testing.T) {
	write := func(h *hist, p int, t1, t2 float64, holder string, tok uint64, k history.Kind) {
		h.op(p, t1, t2, k, history.Event{Prim: history.Mutex, F: history.Write, Name: "a", Holder: holder, Tok: tok})
	}
	base := func() *hist {
		h := newHist()
		h.lock(0, 0, 1, history.Mutex, "a", "h1", 1)
		h.nem(2, history.Pause, "0")
		h.lock(1, 1.5, 5, history.Mutex, "a", "h2", 2)
		write(h, 1, 6, 7, "h2", 2, history.OK)
		h.nem(8, history.Resume, "0")
		h.unlock(1, 10, 11, history.OK, history.Mutex, "a", "h2")
		return h
	}
	h := base()
	write(h, 0, 8.5, 9, "h1", 1, history.Fail) // the paused holder's late write: refused
	rep := check(t, h)
	wantOK(t, rep, Fencing, Linearizability)
	if n := rep.Result(Fencing).Notes; !strings.Contains(strings.Join(n, " "), "1 from holds ended by a pause") {
		t.Errorf("refused write not attributed to the paused hold: %v", n)
	}

	h = base()
	write(h, 0, 8.5, 9, "h1", 1, history.OK) // admitted: stale
	rep = check(t, h)
	wantViolation(t, rep, Fencing, "token 1 admitted after token 2")

	// Overlapping writes may be admitted in either order.
	h = base()
	write(h, 0, 6.5, 9, "h1", 1, history.OK)
	rep = check(t, h)
	wantOK(t, rep, Fencing)
}

func TestStranded(t *testing.T) {
	h := newHist()
	h.lock(0, 0, 1, history.Mutex, "a", "h1", 1)
	h.unlock(0, 2, 3, history.OK, history.Mutex, "a", "h1")
	h.pending(1, 4, history.Event{Prim: history.Mutex, F: history.TryLock, Name: "a", Holder: "h2"})
	h.lock(2, 5, 6, history.Mutex, "a", "h3", 2)
	rep := check(t, h)
	wantViolation(t, rep, Liveness, "never completed", "h2")
	if n := len(rep.Violations()); n != 1 {
		t.Errorf("want only the stranded call, got %d violations", n)
	}
}

// gap: h2 waits 2.5s on "a" after h1 released it (bound 1.3s).
func gap(h *hist) {
	h.lock(0, 0, 1, history.Mutex, "a", "h1", 1)
	h.lock(1, 500, 3500, history.Mutex, "a", "h2", 2)
	h.unlock(0, 900, 1000, history.OK, history.Mutex, "a", "h1")
	h.unlock(1, 3600, 3700, history.OK, history.Mutex, "a", "h2")
}

func TestWaiterOnFreeLock(t *testing.T) {
	h := newHist()
	gap(h)
	rep := check(t, h)
	wantViolation(t, rep, Liveness, "waited 2.5s on a free lock", "h2")
	if rep.LongestWait != 2500*time.Millisecond {
		t.Errorf("longest wait = %v", rep.LongestWait)
	}

	// A partition of the waiter until 2.4s: the window runs to 3.7s.
	h = newHist()
	gap(h)
	h.nem(1200, history.Partition, "1")
	h.nem(2400, history.Heal, "1")
	rep = check(t, h)
	wantOK(t, rep, Liveness)
	if exempt(rep, Liveness, "fault window") != 1 {
		t.Errorf("want the wait exempt")
	}

	// Under the bound: fine, and reported as the longest wait.
	h = newHist()
	h.lock(0, 0, 1, history.Mutex, "a", "h1", 1)
	h.lock(1, 500, 2000, history.Mutex, "a", "h2", 2)
	h.unlock(0, 900, 1000, history.OK, history.Mutex, "a", "h1")
	rep = check(t, h)
	wantOK(t, rep, Liveness)
	if rep.LongestWait != time.Second {
		t.Errorf("longest wait = %v", rep.LongestWait)
	}
}

func TestKeyWithoutTTL(t *testing.T) {
	h := newHist()
	h.lock(0, 0, 1, history.Mutex, "a", "h1", 1)
	h.point(-1, 5, history.Event{Prim: history.Nemesis, F: history.KeyWithoutTTL, Name: "dlock:{a}:x"})
	rep := check(t, h)
	wantViolation(t, rep, Liveness, "dlock:{a}:x")
}

// genMutex generates a valid history of n holds per name: every lock of a
// name waits behind up to `depth` earlier holds; some holds end by Lost
// (then a refused Unlock), some TryLocks fail, the rest are released.
func genMutex(names, n, procs, depth int, seed int64) []history.Event {
	rng := rand.New(rand.NewSource(seed))
	h := newHist()
	for k := 0; k < names; k++ {
		name := fmt.Sprintf("n%d", k)
		t := 1.0
		var grants []float64
		for i := 0; i < n; i++ {
			grants = append(grants, t)
			t += 1 + rng.Float64()*4 + 0.2
		}
		t = 1.0
		for i := 0; i < n; i++ {
			p := rng.Intn(procs)
			holder := fmt.Sprintf("%s-%d-p%d", name, i, p)
			g := grants[i]
			// Invoked while up to depth earlier holds were still ahead.
			inv := g - rng.Float64()*float64(depth)*3.5
			if inv < 0 {
				inv = 0
			}
			if i == 0 {
				inv = g - 0.5
			}
			dur := grants[min(i+1, n-1)] - g - 0.2
			if i == n-1 {
				dur = 3
			}
			h.lock(p, inv, g+0.05, history.Mutex, name, holder, uint64(1000+i))
			if rng.Intn(20) == 0 {
				h.lost(p, g+dur, history.Mutex, name, holder)
				h.unlock(p, g+dur+0.01, g+dur+0.05, history.Fail, history.Mutex, name, holder)
			} else {
				h.unlock(p, g+dur-0.1, g+dur, history.OK, history.Mutex, name, holder)
			}
			if rng.Intn(10) == 0 {
				q := rng.Intn(procs)
				h.op(q, g+0.5, g+0.6, history.Fail, history.Event{Prim: history.Mutex, F: history.TryLock, Name: name, Holder: fmt.Sprintf("try-%s-%d", name, i)})
			}
		}
	}
	return h.events()
}

func TestPerformance(t *testing.T) {
	evs := genMutex(20, 500, 8, 20, 1)
	ops := 0
	for _, e := range evs {
		if e.Kind == history.Invoke {
			ops++
		}
	}
	start := time.Now()
	rep := Check(evs, Options{Lease: 1000 * time.Millisecond})
	elapsed := time.Since(start)
	t.Logf("%d events, %d operations over 20 names, 8 processes: checked in %v", len(evs), ops, elapsed)
	t.Log("\n" + rep.String())
	wantOK(t, rep, Linearizability, LostBeforeAcquired, Liveness)
	if ops < 20000 {
		t.Errorf("only %d operations", ops)
	}
	if elapsed > 10*time.Second {
		t.Errorf("took %v", elapsed)
	}
}

func TestPorcupineTimeoutIsAFailure(t *testing.T) {
	// A real timeout: a big partition with a timeout too short for it.
	evs := genMutex(1, 3000, 8, 40, 2)
	rep := Check(evs, Options{Lease: time.Second, PorcupineTimeout: time.Nanosecond})
	wantViolation(t, rep, Linearizability, "timed out")

	// And deterministically, whatever the machine's speed.
	defer func(f func(porcupine.Model, []porcupine.Operation, time.Duration) porcupine.CheckResult) {
		checkOps = f
	}(checkOps)
	checkOps = func(porcupine.Model, []porcupine.Operation, time.Duration) porcupine.CheckResult {
		return porcupine.Unknown
	}
	h := newHist()
	h.lock(0, 0, 1, history.Mutex, "a", "h1", 1)
	rep = check(t, h)
	wantViolation(t, rep, Linearizability, "timed out")
}

func TestVisualization(t *testing.T) {
	dir := t.TempDir()
	h := newHist()
	overlap(h)
	o := opts
	o.OutDir = filepath.Join(dir, "viz")
	rep := Check(h.events(), o)
	r := rep.Result(Linearizability)
	if r.OK() || r.Violations[0].File == "" {
		t.Fatalf("want a visualization: %v", r.Violations)
	}
	b, err := os.ReadFile(r.Violations[0].File)
	if err != nil || !strings.Contains(string(b), "lock(h2#1)") {
		t.Fatalf("visualization %s: %v, %d bytes", r.Violations[0].File, err, len(b))
	}
	if filepath.Base(r.Violations[0].File) != "porcupine-mutex-a.html" {
		t.Errorf("file %s", r.Violations[0].File)
	}
}

func TestInfoRelease(t *testing.T) {
	// Unlock of unknown outcome, then a Lost: the next holder after the
	// Lost is fine; without the Lost the hold ends at +inf for the models
	// (no violation: the release may be placed anywhere after its call).
	h := newHist()
	h.lock(0, 0, 1, history.Mutex, "a", "h1", 1)
	h.unlock(0, 2, 3, history.Info, history.Mutex, "a", "h1")
	h.lost(0, 4, history.Mutex, "a", "h1")
	h.lock(1, 2, 5, history.Mutex, "a", "h2", 2)
	h.unlock(1, 6, 7, history.Info, history.Mutex, "a", "h2")
	h.lock(2, 6.5, 9, history.Mutex, "a", "h3", 3)
	rep := check(t, h)
	wantOK(t, rep, Linearizability, LostBeforeAcquired)
}

func TestLostRecordedBeforeAcquisition(t *testing.T) {
	// The process recorded the Lost before the Lock's completion (a pause
	// between the two): the Lost still ends that hold.
	h := newHist()
	h.lock(0, 0, 5, history.Mutex, "a", "h1", 1)
	h.lost(0, 4.9, history.Mutex, "a", "h1")
	h.lock(1, 1, 6, history.Mutex, "a", "h2", 2)
	h.unlock(1, 7, 8, history.OK, history.Mutex, "a", "h2")
	rep := check(t, h)
	wantOK(t, rep, Linearizability, LostBeforeAcquired)
	if rep.LostLead.N != 1 {
		t.Errorf("lost lead %v", rep.LostLead)
	}
}

func TestReentrantFreshGrantAfterPause(t *testing.T) {
	// o1 is paused past its lease; o2 takes the lock; o1 resumes, and its
	// next Lock is a fresh hold (count 1, a new token), its old Unlocks
	// refused.
	h := newHist()
	re := func(p int, t1, t2 float64, k history.Kind, f, owner string, tok uint64, n int64) {
		h.op(p, t1, t2, k, history.Event{Prim: history.Reentrant, F: f, Name: "r", Holder: owner, Tok: tok, N: n})
	}
	re(0, 0, 1, history.OK, history.Lock, "o1", 4, 1)
	h.nem(2, history.Pause, "0")
	re(1, 1.5, 3, history.OK, history.Lock, "o2", 5, 1)
	re(1, 4, 5, history.OK, history.Unlock, "o2", 0, 0)
	h.nem(6, history.Resume, "0")
	re(0, 7, 8, history.OK, history.Lock, "o1", 6, 1)
	re(0, 9, 10, history.OK, history.Unlock, "o1", 0, 0)
	rep := check(t, h)
	wantOK(t, rep, Linearizability, LostBeforeAcquired)
	if exempt(rep, LostBeforeAcquired, "paused") != 1 {
		t.Errorf("want o1/o2 exempt")
	}
}

func TestHandOverPausedReceiver(t *testing.T) {
	// The hold moves to p1, which is then paused; another holder takes
	// the lock: exempt, since p1 held it.
	h := newHist()
	h.lock(0, 0, 1, history.HandOver, "a", "h1", 1)
	h.point(1, 2, history.Event{Prim: history.HandOver, F: history.Handed, Name: "a", Holder: "h1", NewHolder: "h2"})
	h.nem(3, history.Pause, "1")
	h.lock(2, 2.5, 5, history.Mutex, "a", "h3", 2)
	h.nem(6, history.Resume, "1")
	h.unlock(1, 7, 8, history.Fail, history.HandOver, "a", "h2")
	h.unlock(2, 7, 8, history.OK, history.Mutex, "a", "h3")
	rep := check(t, h)
	wantOK(t, rep, Linearizability, LostBeforeAcquired)
	if exempt(rep, LostBeforeAcquired, "paused") != 1 {
		t.Errorf("want the pair exempt")
	}
}

// A hand-over whose bearer never claimed the hold (its ExtendRef failed:
// the lease ran out first) ended at some moment since the hand-over, which
// nobody acted on: another holder that took the lock in between is no
// violation, though the bearer's Lost comes after. Once claimed, the hold is
// the bearer's as before, and the same overlap is one.
func TestHandOverUnclaimed(t *testing.T) {
	h := newHist()
	h.lock(0, 0, 1, history.HandOver, "a", "h1", 1)
	h.point(0, 2, history.Event{Prim: history.HandOver, F: history.Handed, Name: "a", Holder: "h1", NewHolder: "h1h"})
	h.lock(1, 1.5, 4, history.Mutex, "a", "h2", 2)
	h.lost(0, 5, history.HandOver, "a", "h1h")
	h.unlock(1, 6, 7, history.OK, history.Mutex, "a", "h2")
	rep := check(t, h)
	wantOK(t, rep, Linearizability, LostBeforeAcquired)

	h = newHist()
	h.lock(0, 0, 1, history.HandOver, "a", "h1", 1)
	h.point(0, 2, history.Event{Prim: history.HandOver, F: history.Handed, Name: "a", Holder: "h1", NewHolder: "h1h"})
	h.point(0, 3, history.Event{Prim: history.HandOver, F: history.Claimed, Name: "a", Holder: "h1h"})
	h.lock(1, 1.5, 4, history.Mutex, "a", "h2", 2)
	h.lost(0, 5, history.HandOver, "a", "h1h")
	h.unlock(1, 6, 7, history.OK, history.Mutex, "a", "h2")
	rep = check(t, h)
	wantViolation(t, rep, LostBeforeAcquired, "h1", "h2")
}

func TestUnknownOutcomes(t *testing.T) {
	h := newHist()
	// A Lock of unknown outcome may have taken the lock: h2 waits up to a
	// lease after it without a liveness violation.
	h.op(0, 0, 1, history.Info, history.Event{Prim: history.Mutex, F: history.Lock, Name: "a", Holder: "h1"})
	h.lock(1, 0.5, 1001, history.Mutex, "a", "h2", 2)
	// A release that never returns: the hold may end any time after.
	h.pending(1, 1100, history.Event{Prim: history.Mutex, F: history.Unlock, Name: "a", Holder: "h2"})
	h.lock(2, 1050, 3000, history.Mutex, "a", "h3", 3)
	h.unlock(2, 3100, 3200, history.OK, history.Mutex, "a", "h3")
	rep := check(t, h)
	wantViolation(t, rep, Liveness, "never completed", "h2")
	if n := len(rep.Violations()); n != 1 {
		t.Errorf("want only the stranded Unlock, got %v", rep.Violations())
	}
}

func TestRWLostSides(t *testing.T) {
	// An owner that writes and reads (downgrade) loses its write hold
	// only: its read hold still keeps writers out.
	h := newHist()
	rw := func(p int, t1, t2 float64, k history.Kind, f, owner string, tok uint64) {
		h.op(p, t1, t2, k, history.Event{Prim: history.RW, F: f, Name: "x", Holder: owner, Tok: tok})
	}
	rw(0, 0, 1, history.OK, history.Lock, "o1", 3)
	rw(0, 2, 3, history.OK, history.RLock, "o1", 0)
	h.point(0, 4, history.Event{Prim: history.RW, F: history.Lost, Name: "x", Holder: "o1"})
	rw(1, 3.5, 5, history.OK, history.Lock, "o2", 4)
	rw(1, 6, 7, history.OK, history.Unlock, "o2", 0)
	rep := check(t, h)
	wantViolation(t, rep, LostBeforeAcquired, "read hold", "o2")

	h.point(0, 4.5, history.Event{Prim: history.RW, F: history.Lost, Name: "x", Holder: "o1", Read: true})
	rep = check(t, h)
	wantOK(t, rep, Linearizability, LostBeforeAcquired)
}

func TestReentrantReenteredAfterFalseLost(t *testing.T) {
	// The watchdog gave up on o1's hold (a renewal's reply was late) but
	// the server kept it: o1's next Lock re-enters it, same token, count 2.
	h := newHist()
	re := func(p int, t1, t2 float64, k history.Kind, f, owner string, tok uint64, n int64) {
		h.op(p, t1, t2, k, history.Event{Prim: history.Reentrant, F: f, Name: "r", Holder: owner, Tok: tok, N: n})
	}
	re(0, 0, 1, history.OK, history.Lock, "o1", 4, 1)
	h.lost(0, 2, history.Reentrant, "r", "o1")
	re(0, 3, 4, history.Fail, history.Unlock, "o1", 0, 0) // ErrLost: nothing changes
	re(0, 5, 6, history.OK, history.Lock, "o1", 4, 2)
	re(1, 5.5, 11, history.OK, history.Lock, "o2", 5, 1)
	re(0, 7, 8, history.OK, history.Unlock, "o1", 0, 1)
	re(0, 9, 10, history.OK, history.Unlock, "o1", 0, 0)
	rep := check(t, h)
	wantOK(t, rep, Linearizability, LostBeforeAcquired)

	// Had o3 got the lock after the Lost, the server could not have kept
	// o1's hold for it to re-enter.
	h = newHist()
	re(0, 0, 1, history.OK, history.Lock, "o1", 4, 1)
	h.lost(0, 2, history.Reentrant, "r", "o1")
	re(1, 2.5, 2.8, history.OK, history.TryLock, "o3", 5, 1)
	re(1, 3, 3.5, history.OK, history.Unlock, "o3", 0, 0)
	re(0, 5, 6, history.OK, history.Lock, "o1", 4, 2)
	re(0, 7, 8, history.OK, history.Unlock, "o1", 0, 1)
	re(0, 9, 10, history.OK, history.Unlock, "o1", 0, 0)
	rep = check(t, h)
	wantViolation(t, rep, Linearizability, "reentrant")
	wantViolation(t, rep, LostBeforeAcquired, "o1", "o3")
}

// A release of unknown outcome whose call came before a data loss: the
// release may have ended the hold at any moment from its call, not only
// from the fault. Seed 1128's 31-minute run: a MultiLock's Unlock released
// two members, which two waiters then held, and Redis was killed before it
// reached the third; its outcome was unknown (EOF), and the model ended the
// hold at the kill, after those waiters held: two false violations.
func TestInfoReleaseBeforeDataLoss(t *testing.T) {
	h := newHist()
	h.op(0, 0, 1, history.OK, history.Event{Prim: history.MultiLock, F: history.Lock, Names: []string{"a", "b"}, Holder: "h1",
		Toks: map[string]uint64{"a": 1, "b": 2}})
	h.lock(1, 0.5, 3.1, history.Mutex, "b", "h2", 3) // waits; held after h1's release of b
	h.op(0, 3, 3.5, history.Info, history.Event{Prim: history.MultiLock, F: history.Unlock, Names: []string{"a", "b"}, Holder: "h1"})
	h.nem(3.2, history.KillRedis, "")
	h.nem(3.4, history.RestartRedis, "")
	h.unlock(1, 5, 5.5, history.Info, history.Mutex, "b", "h2")
	rep := check(t, h)
	wantOK(t, rep, Linearizability, LostBeforeAcquired)
}
