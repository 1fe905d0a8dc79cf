package check

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/dlock-go/dlock/internal/torture/history"
)

// Descriptions, for reports.

// at formats a time relative to the history's start.
func (r *run) at(t int64) string {
	if t == inf || t >= r.horizon {
		return "+inf"
	}
	return fmt.Sprintf("+%.6fs", float64(t-r.t0)/1e9)
}

func (r *run) spanStr(s span) string {
	if s.from == s.to {
		return r.at(s.from)
	}
	return "[" + r.at(s.from) + ", " + r.at(s.to) + "]"
}

// desc describes event i.
func (r *run) desc(i int) string {
	if i < 0 || i >= len(r.evs) {
		return "-"
	}
	e := &r.evs[i]
	var b strings.Builder
	fmt.Fprintf(&b, "#%d %s %s", i, procStr(e.Proc), e.Kind)
	if e.Prim != "" {
		fmt.Fprintf(&b, " %s.%s", e.Prim, e.F)
	} else {
		fmt.Fprintf(&b, " %s", e.F)
	}
	if e.Name != "" {
		fmt.Fprintf(&b, " %q", e.Name)
	}
	if len(e.Names) > 0 {
		fmt.Fprintf(&b, " %q", e.Names)
	}
	if e.Holder != "" {
		fmt.Fprintf(&b, " holder=%s", e.Holder)
	}
	if e.NewHolder != "" {
		fmt.Fprintf(&b, " new=%s", e.NewHolder)
	}
	if e.Tok != 0 {
		fmt.Fprintf(&b, " tok=%d", e.Tok)
	}
	if e.N != 0 {
		fmt.Fprintf(&b, " n=%d", e.N)
	}
	if e.B {
		b.WriteString(" b=true")
	}
	if e.Read {
		b.WriteString(" read")
	}
	if e.Target != "" {
		fmt.Fprintf(&b, " target=%s", e.Target)
	}
	if e.Err != "" {
		fmt.Fprintf(&b, " err=%q", e.Err)
	}
	fmt.Fprintf(&b, " at %s", r.at(e.T))
	return b.String()
}

func procStr(p int) string {
	if p < 0 {
		return "ctl"
	}
	return "p" + strconv.Itoa(p)
}

// holdStr describes a hold: who, what, when, how it ended.
func (r *run) holdStr(h *hold) string {
	var b strings.Builder
	side := ""
	if h.space == history.RW {
		side = " write"
		if h.read {
			side = " read"
		}
	}
	procs := make([]string, len(h.procs))
	for i, p := range h.procs {
		procs[i] = procStr(p)
	}
	fmt.Fprintf(&b, "%s%s hold of %q by %s (%s", h.space, side, h.name, strings.Join(h.holders, "->"), strings.Join(procs, ","))
	if h.tok != 0 {
		fmt.Fprintf(&b, ", tok %d", h.tok)
	}
	if h.space == history.Semaphore {
		fmt.Fprintf(&b, ", %d permits", h.n)
	}
	fmt.Fprintf(&b, ") acquired %s", r.spanStr(h.acq))
	switch h.kind {
	case endOpen:
		b.WriteString(", still held at the end")
	default:
		fmt.Fprintf(&b, ", ended %s %s", h.kind, r.spanStr(h.end))
	}
	if h.exempt != endOpen {
		fmt.Fprintf(&b, ", exempt (%s at %s)", h.exempt, r.at(h.exEnd.from))
	}
	return b.String()
}
