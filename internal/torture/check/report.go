package check

import (
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dlock-go/dlock/internal/torture/history"
)

// The checkers' names (Result.Name), in the order of Report.Checkers.
const (
	Linearizability    = "linearizability"
	LostBeforeAcquired = "lost-before-acquired"
	SemaphoreSweep     = "semaphore"
	ElectionTerms      = "election-terms"
	Fencing            = "fencing"
	Liveness           = "liveness"
)

// Violation is one broken promise.
type Violation struct {
	Space string // the lock space (history.Space), if any
	Name  string // the lock, semaphore, latch or resource name, if any
	What  string // what happened, naming the events involved
	File  string // a porcupine visualization, if one was written
}

func (v Violation) String() string {
	if v.Space == "" && v.Name == "" {
		return v.What
	}
	return fmt.Sprintf("%s %q: %s", v.Space, v.Name, v.What)
}

// Count is a named count.
type Count struct {
	What  string
	Count int
}

// Result is what one checker found.
type Result struct {
	Name       string
	Checked    int         // how many things it checked (see Notes for what)
	Violations []Violation // empty when the promise held
	Exempt     []Count     // cases not judged, by reason (the exemption rules)
	Notes      []string    // figures
}

// OK reports whether the checker found no violation.
func (r Result) OK() bool { return len(r.Violations) == 0 }

func (r *Result) add(v Violation) { r.Violations = append(r.Violations, v) }

func (r *Result) exempt(what string) {
	for i := range r.Exempt {
		if r.Exempt[i].What == what {
			r.Exempt[i].Count++
			return
		}
	}
	r.Exempt = append(r.Exempt, Count{what, 1})
}

func (r *Result) note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

// OpCount counts one function of one primitive by outcome.
type OpCount struct {
	Prim, F                  string
	OK, Fail, Info, NoReturn int
}

// Figure summarizes durations.
type Figure struct {
	N           int
	Min, Median time.Duration
}

func figure(ds []time.Duration) Figure {
	if len(ds) == 0 {
		return Figure{}
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return Figure{N: len(ds), Min: ds[0], Median: ds[len(ds)/2]}
}

func (f Figure) String() string {
	if f.N == 0 {
		return "none"
	}
	return fmt.Sprintf("min %v, median %v (%d)", f.Min, f.Median, f.N)
}

// Report is what Check found.
type Report struct {
	Events int
	Span   time.Duration // from the first event to the last
	Lease  time.Duration // as used (Options or the history's settings)
	Period time.Duration

	Ops        []OpCount // by primitive and function
	Faults     []Count   // nemesis faults (starts and instants) by function
	LostPoints int
	Holds      []Count // holds by space
	Stats      []Count // oddities that are not violations

	// LostLead: for each hold ended by Lost whose next hold on the name
	// was another holder's, how long before that next acquisition
	// completed the Lost came (negative: after).
	LostLead Figure
	// LongestWait: the longest time a blocking acquisition waited on a
	// free lock outside fault windows, and where.
	LongestWait      time.Duration
	LongestWaitWhere string

	Checkers []Result
}

// OK reports whether no checker found a violation.
func (r Report) OK() bool {
	for _, c := range r.Checkers {
		if !c.OK() {
			return false
		}
	}
	return true
}

// Result returns the result of the checker called name, or nil.
func (r Report) Result(name string) *Result {
	for i := range r.Checkers {
		if r.Checkers[i].Name == name {
			return &r.Checkers[i]
		}
	}
	return nil
}

// Violations returns every violation, prefixed by its checker's name.
func (r Report) Violations() []string {
	var out []string
	for _, c := range r.Checkers {
		for _, v := range c.Violations {
			out = append(out, c.Name+": "+v.String())
		}
	}
	return out
}

// maxListed bounds the violations String lists per checker.
const maxListed = 20

// String is a readable summary: counts, one line per checker, then the
// violations (the first maxListed of each checker), exemptions and figures.
func (r Report) String() string {
	var b strings.Builder
	verdict := "OK"
	if !r.OK() {
		verdict = "VIOLATIONS"
	}
	fmt.Fprintf(&b, "torture check: %s - %d events over %v, lease %v, period %v\n", verdict, r.Events,
		r.Span.Round(time.Millisecond), r.Lease, r.Period)

	b.WriteString("\noperations:\n")
	tw := tabwriter.NewWriter(&b, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "prim\tfunction\tok\tfail\tinfo\tno return\t")
	for _, o := range r.Ops {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t\n", o.Prim, o.F, o.OK, o.Fail, o.Info, o.NoReturn)
	}
	tw.Flush()
	fmt.Fprintf(&b, "lost points: %d\n", r.LostPoints)
	writeCounts(&b, "holds", r.Holds)
	writeCounts(&b, "faults", r.Faults)
	writeCounts(&b, "also seen (not violations)", r.Stats)
	fmt.Fprintf(&b, "lost lead (next holder's acquisition minus Lost): %v\n", r.LostLead)
	if r.LongestWaitWhere != "" {
		fmt.Fprintf(&b, "longest wait on a free lock outside faults: %v (%s)\n", r.LongestWait, r.LongestWaitWhere)
	}

	b.WriteString("\ncheckers:\n")
	tw = tabwriter.NewWriter(&b, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "checker\tchecked\tviolations\texempt\t")
	for _, c := range r.Checkers {
		ex := 0
		for _, e := range c.Exempt {
			ex += e.Count
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t\n", c.Name, c.Checked, len(c.Violations), ex)
	}
	tw.Flush()

	for _, c := range r.Checkers {
		if c.Checked == 0 && len(c.Violations) == 0 && len(c.Exempt) == 0 {
			continue // nothing of its kind in the history
		}
		fmt.Fprintf(&b, "\n%s:\n", c.Name)
		for _, n := range c.Notes {
			fmt.Fprintf(&b, "  %s\n", n)
		}
		for _, e := range c.Exempt {
			fmt.Fprintf(&b, "  exempt: %s: %d\n", e.What, e.Count)
		}
		for i, v := range c.Violations {
			if i == maxListed {
				fmt.Fprintf(&b, "  ... and %d more violations\n", len(c.Violations)-maxListed)
				break
			}
			fmt.Fprintf(&b, "  VIOLATION %s\n", v)
		}
	}
	return b.String()
}

func writeCounts(b *strings.Builder, title string, cs []Count) {
	if len(cs) == 0 {
		return
	}
	parts := make([]string, len(cs))
	for i, c := range cs {
		parts[i] = fmt.Sprintf("%s %d", c.What, c.Count)
	}
	fmt.Fprintf(b, "%s: %s\n", title, strings.Join(parts, ", "))
}

// count fills the report's counts.
func (r *run) count(rep *Report) {
	ops := map[[2]string]*OpCount{}
	faults := map[string]int{}
	for i, e := range r.evs {
		switch e.Kind {
		case history.Point:
			switch {
			case e.F == history.Lost:
				rep.LostPoints++
			case nemesis(&r.evs[i]) && (faultEnds[e.F] != "" || faultInstants[e.F]):
				faults[e.F]++ // fault starts and one-instant faults
			}
			continue
		case history.Invoke:
			if r.doneOf[i] >= 0 {
				continue
			}
		}
		if e.Kind != history.Invoke && r.invOf[i] < 0 {
			continue // counted as a liveness violation
		}
		k := [2]string{e.Prim, e.F}
		oc := ops[k]
		if oc == nil {
			oc = &OpCount{Prim: e.Prim, F: e.F}
			ops[k] = oc
		}
		switch e.Kind {
		case history.OK:
			oc.OK++
		case history.Fail:
			oc.Fail++
		case history.Info:
			oc.Info++
		case history.Invoke:
			oc.NoReturn++
		}
	}
	for _, oc := range ops {
		rep.Ops = append(rep.Ops, *oc)
	}
	sort.Slice(rep.Ops, func(i, j int) bool {
		a, b := rep.Ops[i], rep.Ops[j]
		return a.Prim < b.Prim || a.Prim == b.Prim && a.F < b.F
	})
	rep.Faults = sortedCounts(faults)
	holds := map[string]int{}
	for _, h := range r.holds {
		holds[h.space]++
	}
	rep.Holds = sortedCounts(holds)
	stats := map[string]int{
		"Lost points for no open hold":                  r.lostWithoutHold,
		"releases of holds already ended":               r.releaseAfterEnd,
		"exempted holds the owner found expired":        r.vanishedAfterExc,
		"completions without invocation (see liveness)": len(r.orphans),
	}
	rep.Stats = sortedCounts(stats)
}

func sortedCounts(m map[string]int) []Count {
	var out []Count
	for k, v := range m {
		if v != 0 {
			out = append(out, Count{k, v})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].What < out[j].What })
	return out
}
