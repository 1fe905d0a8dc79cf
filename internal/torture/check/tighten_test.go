package check

import (
	"fmt"
	"math/rand"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/dlock-go/dlock/internal/torture/history"
)

// genRW generates a valid RW history: epochs of one writer (sometimes
// re-entering, sometimes downgrading to a read hold) or of 1-4 concurrent
// readers; every acquisition is invoked up to depth epochs early.
func genRW(names, n, procs, depth int, seed int64) []history.Event {
	rng := rand.New(rand.NewSource(seed))
	h := newHist()
	rw := func(p int, t1, t2 float64, f, name, owner string, tok uint64) {
		h.op(p, t1, t2, history.OK, history.Event{Prim: history.RW, F: f, Name: name, Holder: owner, Tok: tok})
	}
	for k := 0; k < names; k++ {
		name := fmt.Sprintf("x%d", k)
		t, tok := 1.0, uint64(100)
		early := func() float64 { return max(0, t-rng.Float64()*float64(depth)*4) }
		for i := 0; i < n; i++ {
			if rng.Intn(2) == 0 {
				p := rng.Intn(procs)
				o := fmt.Sprintf("w-%s-%d", name, i)
				tok++
				rw(p, early(), t+0.05, history.Lock, name, o, tok)
				end := t + 1 + rng.Float64()*3
				switch rng.Intn(4) {
				case 0:
					rw(p, t+0.3, t+0.4, history.Lock, name, o, tok)
					rw(p, t+0.5, t+0.6, history.Unlock, name, o, 0)
				case 1:
					rw(p, t+0.3, t+0.4, history.RLock, name, o, 0)
					rw(p, t+0.5, t+0.6, history.RUnlock, name, o, 0)
				}
				rw(p, end-0.1, end, history.Unlock, name, o, 0)
				t = end + 0.1
				continue
			}
			last := t
			for j := 0; j < 1+rng.Intn(4); j++ {
				p := rng.Intn(procs)
				o := fmt.Sprintf("r-%s-%d-%d", name, i, j)
				g := t + rng.Float64()*0.3
				rw(p, early(), g+0.05, history.RLock, name, o, 0)
				end := g + 1 + rng.Float64()*3
				rw(p, end-0.1, end, history.RUnlock, name, o, 0)
				last = max(last, end)
			}
			t = last + 0.1
		}
	}
	return h.events()
}

// genReentrant generates a valid reentrant history: owners (one per
// process) take the lock in turn, some re-entering once.
func genReentrant(n, procs, depth int, seed int64) []history.Event {
	rng := rand.New(rand.NewSource(seed))
	h := newHist()
	re := func(p int, t1, t2 float64, f, owner string, tok uint64, cnt int64) {
		h.op(p, t1, t2, history.OK, history.Event{Prim: history.Reentrant, F: f, Name: "r", Holder: owner, Tok: tok, N: cnt})
	}
	t, tok := 1.0, uint64(7)
	busy := map[int]float64{} // an owner waits for one hold at a time
	for i := 0; i < n; i++ {
		p := rng.Intn(procs)
		o := fmt.Sprintf("o%d", p)
		tok += uint64(1 + rng.Intn(3))
		inv := max(busy[p], t-rng.Float64()*float64(depth)*4)
		re(p, inv, t+0.05, history.Lock, o, tok, 1)
		end := t + 1 + rng.Float64()*3
		if rng.Intn(3) == 0 {
			re(p, t+0.3, t+0.4, history.Lock, o, tok, 2)
			re(p, t+0.5, t+0.6, history.Unlock, o, 0, 1)
		}
		re(p, end-0.1, end, history.Unlock, o, 0, 0)
		busy[p] = end + 0.01
		t = end + 0.1
	}
	return h.events()
}

// shake moves some whole operations (invocation and completion together)
// in time and swaps some tokens, which makes many histories invalid.
func shake(evs []history.Event, rng *rand.Rand) []history.Event {
	out := append([]history.Event(nil), evs...)
	type pid struct {
		p  int
		id int64
	}
	shift := map[pid]int64{}
	for _, e := range out {
		if e.Kind == history.Invoke && rng.Intn(8) == 0 {
			shift[pid{e.Proc, e.ID}] = int64((rng.Float64() - 0.5) * 8e6)
		}
	}
	for i := range out {
		out[i].T += shift[pid{out[i].Proc, out[i].ID}]
		if out[i].Tok != 0 && rng.Intn(30) == 0 {
			out[i].Tok += uint64(rng.Intn(5)) - 2
		}
	}
	history.Sort(out)
	return out
}

// TestTightenKeepsVerdict: porcupine says the same with and without
// tighten, on valid histories and on shaken ones.
func TestTightenKeepsVerdict(t *testing.T) {
	rng := rand.New(rand.NewSource(5))
	counts := map[string][2]int{} // kind -> (linearizable, not)
	for i := 0; i < 600; i++ {
		var evs []history.Event
		var kind string
		switch i % 3 {
		case 0:
			kind, evs = "mutex", genMutex(1, 12, 4, 4, int64(i))
		case 1:
			kind, evs = "reentrant", genReentrant(12, 4, 4, int64(i))
		default:
			kind, evs = "rw", genRW(1, 10, 4, 3, int64(i))
		}
		if i%2 == 1 {
			evs = shake(evs, rng)
		}
		r := newRun(evs, Options{Lease: time.Second})
		r.buildHolds()
		for _, p := range r.lockPartitions() {
			if p.orig == nil {
				continue
			}
			want := porcupine.CheckOperations(p.model, p.orig)
			got := porcupine.CheckOperations(p.model, p.ops)
			if got != want {
				t.Fatalf("%s history %d: linearizable %v untightened, %v tightened", kind, i, want, got)
			}
			c := counts[kind]
			if want {
				c[0]++
			} else {
				c[1]++
			}
			counts[kind] = c
		}
	}
	t.Logf("partitions (linearizable, not): %v", counts)
	for k, c := range counts {
		if c[0] == 0 || c[1] == 0 {
			t.Errorf("%s: want both verdicts among the cases, got %v", k, c)
		}
	}
}

// TestRWPerformance: a heavily overlapping RW history stays fast.
func TestRWPerformance(t *testing.T) {
	evs := genRW(4, 500, 8, 20, 3)
	start := time.Now()
	rep := Check(evs, Options{Lease: time.Second})
	t.Logf("%d events: checked in %v; %v", len(evs), time.Since(start), rep.Result(Linearizability).Notes)
	wantOK(t, rep, Linearizability, LostBeforeAcquired, Liveness)
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("took %v", d)
	}
}
