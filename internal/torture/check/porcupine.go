package check

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/dlock-go/dlock/internal/torture/history"
)

// partition is the porcupine history of one (space, name).
type partition struct {
	space, name string
	model       porcupine.Model
	ops         []porcupine.Operation
	holds       []holdOps // where each hold's operations are
	// orig: the operations before tighten, for explanations and
	// visualizations; nil when not tightened.
	orig []porcupine.Operation
}

// checkOps runs porcupine; a variable so that tests can force a result.
var checkOps = porcupine.CheckOperationsTimeout

// lockPartitions turns the holds of the lock spaces into model operations:
// per hold, its acquisition, its re-entries and inner releases (reentrant,
// RW), and its end. Acquisitions that failed or whose outcome is unknown
// are left out: they change nothing in any state (an unknown acquisition
// that did take the lock only keeps others waiting until its lease ends),
// and leaving them out keeps the search small.
func (r *run) lockPartitions() []*partition {
	models := map[string]porcupine.Model{
		history.Mutex: mutexModel, history.Redlock: mutexModel, history.Sentinel: mutexModel,
		history.Election: mutexModel, history.Reentrant: reentrantModel, history.RW: rwModel,
	}
	parts := map[string]*partition{}
	var order []*partition
	for _, h := range r.holds {
		m, ok := models[h.space]
		if !ok {
			continue
		}
		key := h.space + "\x00" + h.name
		p := parts[key]
		if p == nil {
			p = &partition{space: h.space, name: h.name, model: m}
			parts[key] = p
			order = append(order, p)
		}
		p.holds = append(p.holds, r.holdOps(p, h))
	}
	for _, p := range order {
		tighten(p)
	}
	return order
}

func (r *run) add(p *partition, proc int, in input, at span, desc string) {
	if proc < 0 {
		proc = r.ctlProc
	}
	to := at.to
	if to >= r.horizon {
		to = r.horizon
	}
	p.ops = append(p.ops, porcupine.Operation{
		ClientId: proc, Input: in, Call: at.from, Return: to,
		Metadata: opMeta{idx: len(p.ops), desc: desc},
	})
}

func (r *run) holdOps(p *partition, h *hold) holdOps {
	who := fmt.Sprintf("%s#%d", h.holder, h.id)
	loc := holdOps{h: h, ops: []int{len(p.ops)}}
	r.add(p, h.procs[0], input{kind: opAcquire, who: who, owner: h.holder, tok: h.tok, read: h.read}, h.acq, r.desc(h.acqEv))
	end, kind, ended := h.modelEnd()
	cut := inf // steps from the exemption on are no longer modelled
	if h.exempt != endOpen {
		cut = h.exEnd.from
	}
	lastStep := int64(0)
	for _, s := range h.steps {
		if s.at.from >= cut {
			continue
		}
		k := opAcquire
		if s.kind == stepUnlock {
			k = opRelease
		}
		loc.ops = append(loc.ops, len(p.ops))
		r.add(p, s.proc, input{kind: k, who: who, owner: h.holder, tok: s.tok, read: h.read}, s.at, r.desc(s.ev))
		lastStep = max(lastStep, s.at.to)
	}
	if !ended {
		return loc
	}
	k := opEnd
	if kind == endRelease {
		k = opRelease
	}
	if h.exempt != endOpen {
		// A step cut by the exemption may complete after it: the end
		// may come after the steps kept.
		end.to = max(end.to, lastStep)
	}
	ev := h.endEv
	if h.exempt != endOpen {
		ev = h.exEv
	}
	proc := h.procs[len(h.procs)-1]
	loc.ops, loc.ended = append(loc.ops, len(p.ops)), true
	r.add(p, proc, input{kind: k, who: who, owner: h.holder, read: h.read}, end, fmt.Sprintf("%s: %s", kind, r.desc(ev)))
	return loc
}

// latchPartitions reads the latch operations straight from the history.
// Failed operations and Awaits that did not return at zero constrain
// nothing and are left out; operations of unknown outcome (Info, or never
// completed) may take effect until the end.
func (r *run) latchPartitions() []*partition {
	parts := map[string]*partition{}
	var order []*partition
	for i, e := range r.evs {
		if e.Kind != history.Invoke || e.Prim != history.Latch {
			continue
		}
		c := r.callAt(i)
		k := c.kind()
		if k == history.Fail {
			continue
		}
		in := input{info: k == history.Info}
		switch e.F {
		case history.SetCount:
			in.kind, in.n = opSet, c.n()
			in.set = c.done != nil && c.done.B
		case history.CountDown:
			in.kind = opCountDown
		case history.Await:
			if k != history.OK {
				continue
			}
			in.kind = opAwait
		case history.Delete:
			in.kind = opDelete
		default:
			continue
		}
		at := span{e.T, c.doneT(r.horizon)}
		if in.info {
			at.to = r.horizon
		}
		p := parts[c.name()]
		if p == nil {
			p = &partition{space: history.Latch, name: c.name(), model: latchModel}
			parts[c.name()] = p
			order = append(order, p)
		}
		r.add(p, e.Proc, in, at, r.desc(c.ev()))
	}
	// The latch lives on the main server: its data loss zeroes the count.
	for _, i := range r.dataLoss[history.Latch] {
		for _, p := range order {
			r.add(p, -1, input{kind: opReset}, span{r.evs[i].T, r.evs[i].T}, r.desc(i))
		}
	}
	return order
}

// checkLinearizable runs porcupine on every partition, in parallel.
func (r *run) checkLinearizable() Result {
	res := Result{Name: Linearizability}
	parts := append(r.lockPartitions(), r.latchPartitions()...)
	type outcome struct {
		res     porcupine.CheckResult
		elapsed time.Duration
	}
	out := make([]outcome, len(parts))
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for i, p := range parts {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			start := time.Now()
			out[i] = outcome{checkOps(p.model, p.ops, r.o.PorcupineTimeout), time.Since(start)}
		}()
	}
	wg.Wait()
	ops := 0
	var slowest time.Duration
	slowName := ""
	for i, p := range parts {
		ops += len(p.ops)
		if out[i].elapsed > slowest {
			slowest, slowName = out[i].elapsed, p.space+"/"+p.name
		}
		switch out[i].res {
		case porcupine.Ok:
		case porcupine.Unknown:
			res.add(Violation{Space: p.space, Name: p.name,
				What: fmt.Sprintf("porcupine timed out after %v on %d operations: linearizability unknown", r.o.PorcupineTimeout, len(p.ops))})
		default:
			res.add(r.illegal(p))
		}
	}
	res.Checked = len(parts)
	if len(parts) > 0 {
		res.note("%d partitions, %d operations; slowest %s in %v", len(parts), ops, slowName, slowest.Round(time.Microsecond))
	}
	for _, h := range r.holds {
		if !exclusiveSpaces[h.space] {
			continue
		}
		switch h.exempt {
		case endPaused:
			res.exempt("holds ended at a pause")
		case endDataLoss:
			res.exempt("holds ended at data loss")
		}
	}
	return res
}

// illegal describes a partition found not linearizable: where the longest
// linearization porcupine found stops, and what it could not place next.
// With OutDir it also writes porcupine's visualization.
func (r *run) illegal(p *partition) Violation {
	v := Violation{Space: p.space, Name: p.name}
	var b strings.Builder
	fmt.Fprintf(&b, "not linearizable (%d operations)", len(p.ops))
	// Explained on the tightened operations: the verdict is the same, the
	// search is quick, and a longest linearization then stops where the
	// history goes wrong rather than wherever a blocked acquisition could
	// be slipped in early. The times printed are as they happened.
	result, info := porcupine.CheckOperationsVerbose(p.model, p.ops, r.o.PorcupineTimeout)
	if result == porcupine.Illegal {
		r.explain(&b, p, info)
	}
	if p.orig != nil && r.o.OutDir != "" {
		b.WriteString(" (the visualization shows blocked acquisitions from when the lock could first be theirs)")
	}
	if r.o.OutDir != "" {
		path := filepath.Join(r.o.OutDir, "porcupine-"+fileSafe(p.space)+"-"+fileSafe(p.name)+".html")
		if err := os.MkdirAll(r.o.OutDir, 0o755); err != nil {
			fmt.Fprintf(&b, "; visualization not written: %v", err)
		} else if err := porcupine.VisualizePath(p.model, info, path); err != nil {
			fmt.Fprintf(&b, "; visualization not written: %v", err)
		} else {
			v.File = path
			fmt.Fprintf(&b, "; see %s", path)
		}
	}
	v.What = b.String()
	return v
}

func (r *run) explain(b *strings.Builder, p *partition, info porcupine.LinearizationInfo) {
	m, ops, orig := p.model, p.ops, p.ops
	if p.orig != nil {
		orig = p.orig
	}
	parts := info.PartialLinearizationsOperations()
	if len(parts) == 0 {
		return
	}
	var longest []porcupine.Operation
	for _, l := range parts[0] {
		if len(l) > len(longest) {
			longest = l
		}
	}
	placed := make([]bool, len(ops))
	state := m.Init()
	for _, o := range longest {
		placed[o.Metadata.(opMeta).idx] = true
		_, state = m.Step(state, o.Input, o.Output)
	}
	// The operation that could not be placed: the unplaced one that
	// returned first (every linearization must place it before that).
	stuck := -1
	for i, o := range ops {
		if !placed[i] && (stuck < 0 || o.Return < ops[stuck].Return) {
			stuck = i
		}
	}
	fmt.Fprintf(b, "; a longest linearization places %d, reaching state {%s}", len(longest), m.DescribeState(state))
	if n := len(longest); n > 0 {
		fmt.Fprintf(b, " after %s [%s]", longest[n-1].Input.(input), longest[n-1].Metadata.(opMeta).desc)
	}
	if stuck >= 0 {
		o := orig[stuck]
		fmt.Fprintf(b, "; cannot place %s [%s], called %s, returned %s", o.Input.(input), o.Metadata.(opMeta).desc, r.at(o.Call), r.at(o.Return))
	}
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

func fileSafe(s string) string { return unsafeChars.ReplaceAllString(s, "_") }
