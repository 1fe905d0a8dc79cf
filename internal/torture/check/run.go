package check

import (
	"sort"
	"time"

	"github.com/dlock-go/dlock/internal/torture/history"
)

// nemesis reports whether e is one of the controller's points: a fault, a
// setting, a final observation. (Their functions are distinct from the
// primitives', so an event without a Prim counts too.)
func nemesis(e *history.Event) bool {
	return e.Kind == history.Point && (e.Prim == history.Nemesis || e.Prim == "")
}

// call is an operation: its invocation and its completion (nil: none).
type call struct {
	inv, done *history.Event
	invIdx    int
	doneIdx   int // -1: never completed
}

// merged returns the completion's field when set, else the invocation's.
func (c call) holder() string {
	if c.done != nil && c.done.Holder != "" {
		return c.done.Holder
	}
	return c.inv.Holder
}

func (c call) name() string {
	if c.done != nil && c.done.Name != "" {
		return c.done.Name
	}
	return c.inv.Name
}

func (c call) names() []string {
	if c.done != nil && len(c.done.Names) > 0 {
		return c.done.Names
	}
	return c.inv.Names
}

func (c call) tok() uint64 {
	if c.done != nil && c.done.Tok != 0 {
		return c.done.Tok
	}
	return c.inv.Tok
}

func (c call) toks() map[string]uint64 {
	if c.done != nil && len(c.done.Toks) > 0 {
		return c.done.Toks
	}
	return c.inv.Toks
}

func (c call) n() int64 {
	if c.done != nil && c.done.N != 0 {
		return c.done.N
	}
	return c.inv.N
}

func (c call) kind() history.Kind {
	if c.done == nil {
		return history.Info // never completed: its effect is unknown
	}
	return c.done.Kind
}

func (c call) doneT(horizon int64) int64 {
	if c.done == nil {
		return horizon
	}
	return c.done.T
}

func (c call) ev() int {
	if c.done == nil {
		return c.invIdx
	}
	return c.doneIdx
}

// run is the state of one Check.
type run struct {
	evs     []history.Event
	o       Options
	t0      int64
	tEnd    int64
	horizon int64 // tEnd+1: "+inf" for porcupine, which wants finite times
	lease   time.Duration
	period  time.Duration
	bound   time.Duration // Lease + Period: the liveness bound
	ctlProc int           // porcupine client id for the controller's operations

	invOf    []int // for a completion event, its invocation's index; -1 otherwise
	doneOf   []int // for an invocation, its completion's index; -1 if none
	orphans  []int // completions without an invocation
	stranded []int // invocations without a completion

	holds    []*hold
	byKey    map[string][]*hold // space|name|holder|side -> its holds, in order
	keysOf   map[string][]string
	open     map[*hold]struct{} // holds in stOpen
	pauses   map[int][]int      // proc -> Pause event indexes, in order
	dataLoss map[string][]int   // space -> data-loss event indexes, in order

	// early: Lost points that found no hold, by holder: the hold's
	// acquisition may have been recorded after its Lost.
	early     map[string][]int
	earlyUsed map[int]bool

	lostWithoutHold  int // Lost points for no open hold (a Lost racing a release)
	releaseAfterEnd  int // releases of holds that had already ended
	vanishedAfterExc int // exempted holds the owner found gone (a fresh grant)
	revived          int // holds re-entered after a Lost or a failed release
}

func newRun(evs []history.Event, o Options) *run {
	r := &run{evs: evs, o: o, ctlProc: 0}
	if len(evs) > 0 {
		r.t0, r.tEnd = evs[0].T, evs[len(evs)-1].T
	}
	r.horizon = r.tEnd + 1
	r.lease, r.period = o.Lease, o.Period
	for i := range evs {
		if e := &evs[i]; nemesis(e) && e.F == history.Setting {
			switch e.Name {
			case "lease":
				r.lease = time.Duration(e.N) * time.Millisecond
			case "period":
				r.period = time.Duration(e.N) * time.Millisecond
			}
		}
		if evs[i].Proc >= r.ctlProc {
			r.ctlProc = evs[i].Proc + 1
		}
	}
	if r.lease <= 0 {
		r.lease = 30 * time.Second
	}
	if r.period <= 0 {
		r.period = r.lease / 3
	}
	r.bound = r.lease + r.period
	if r.o.PorcupineTimeout <= 0 {
		r.o.PorcupineTimeout = 30 * time.Second
	}
	r.pair()
	return r
}

// pair matches every invocation with its completion (same Proc and ID).
func (r *run) pair() {
	r.invOf = make([]int, len(r.evs))
	r.doneOf = make([]int, len(r.evs))
	type pid struct {
		proc int
		id   int64
	}
	pending := map[pid]int{}
	for i, e := range r.evs {
		r.invOf[i], r.doneOf[i] = -1, -1
		switch e.Kind {
		case history.Invoke:
			k := pid{e.Proc, e.ID}
			if j, ok := pending[k]; ok {
				r.stranded = append(r.stranded, j) // its ID was reused before it completed
			}
			pending[k] = i
		case history.OK, history.Fail, history.Info:
			k := pid{e.Proc, e.ID}
			inv, ok := pending[k]
			if !ok {
				r.orphans = append(r.orphans, i)
				continue
			}
			delete(pending, k)
			r.invOf[i], r.doneOf[inv] = inv, i
		}
	}
	for _, i := range pending {
		r.stranded = append(r.stranded, i)
	}
	sort.Ints(r.stranded)
}

func (r *run) callAt(inv int) call {
	c := call{inv: &r.evs[inv], invIdx: inv, doneIdx: r.doneOf[inv]}
	if c.doneIdx >= 0 {
		c.done = &r.evs[c.doneIdx]
	}
	return c
}
