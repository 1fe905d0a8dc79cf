package check

import (
	"fmt"
	"slices"
	"strings"

	"github.com/anishathalye/porcupine"
)

// The sequential specifications porcupine checks the holds against. Every
// state is an immutable value: Step returns a new one.

// opKind is what a model operation does.
type opKind uint8

const (
	opAcquire   opKind = iota // a hold taken, or re-entered (reentrant, RW)
	opRelease                 // one level released, OK
	opEnd                     // the hold ends entirely: Lost, an exemption, a release of unknown outcome or refused
	opSet                     // latch TrySetCount(n): set tells whether it set
	opCountDown               // latch
	opAwait                   // latch: returned at zero
	opDelete                  // latch
	opReset                   // latch: the server lost its data
)

// input is a model operation. Outputs are folded in (set), so porcupine's
// Output is unused.
type input struct {
	kind  opKind
	who   string // the hold's identity, unique: its acquiring holder and the hold's number
	owner string // RW: the owner, whom a writer's own reads do not conflict with
	tok   uint64
	read  bool  // RW: the read side
	n     int64 // latch count
	set   bool  // latch SetCount's result
	info  bool  // latch: the outcome is unknown, either effect may have happened
}

func (in input) String() string {
	side := ""
	if in.read {
		side = "r"
	}
	switch in.kind {
	case opAcquire:
		if in.tok != 0 {
			return fmt.Sprintf("%slock(%s) tok %d", side, in.who, in.tok)
		}
		return fmt.Sprintf("%slock(%s)", side, in.who)
	case opRelease:
		return fmt.Sprintf("%sunlock(%s)", side, in.who)
	case opEnd:
		return fmt.Sprintf("%send(%s)", side, in.who)
	case opSet:
		return fmt.Sprintf("setcount(%d) -> %v%s", in.n, in.set, infoMark(in.info))
	case opCountDown:
		return "countdown" + infoMark(in.info)
	case opAwait:
		return "await -> zero"
	case opDelete:
		return "delete" + infoMark(in.info)
	case opReset:
		return "data loss: count 0"
	}
	return "?"
}

func infoMark(info bool) string {
	if info {
		return " (outcome unknown)"
	}
	return ""
}

// opMeta labels a porcupine operation with the events it came from.
type opMeta struct {
	idx  int // index in the partition's operations
	desc string
}

func describeOp(in, _ any) string { return in.(input).String() }
func describeMeta(m any) string   { return m.(opMeta).desc }
func hashString(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h ^ 0xff // separates strings
}

func hashUint(h, v uint64) uint64 {
	h ^= v
	h *= 1099511628211
	return h
}

const fnvOffset uint64 = 14695981039346656037

// Every hold ends exactly once, by its own operations (the identities are
// unique per hold), so an operation that finds its hold gone is illegal.

// mutexState: mutex, redlock, sentinel and election. last is the highest
// token issued so far: a free lock must be taken with a higher one (0: no
// token recorded, not checked).
type mutexState struct {
	holder string
	last   uint64
}

var mutexModel = porcupine.Model{
	Init: func() any { return mutexState{} },
	Step: func(st, in, _ any) (bool, any) {
		s, o := st.(mutexState), in.(input)
		switch o.kind {
		case opAcquire:
			if s.holder != "" || (o.tok != 0 && o.tok <= s.last) {
				return false, s
			}
			s.holder = o.who
			s.last = max(s.last, o.tok)
			return true, s
		case opRelease, opEnd:
			// Each hold has exactly one end, after its acquisition: it
			// must find the hold.
			if s.holder != o.who {
				return false, s
			}
			s.holder = ""
			return true, s
		}
		return false, s
	},
	Equal: func(a, b any) bool { return a.(mutexState) == b.(mutexState) },
	Hash: func(st any) uint64 {
		s := st.(mutexState)
		return hashUint(hashString(fnvOffset, s.holder), s.last)
	},
	DescribeOperation:         describeOp,
	DescribeOperationMetadata: describeMeta,
	DescribeState: func(st any) string {
		s := st.(mutexState)
		if s.holder == "" {
			return fmt.Sprintf("free, last tok %d", s.last)
		}
		return fmt.Sprintf("held by %s, last tok %d", s.holder, s.last)
	},
}

// reentrantState: one hold with a count; a re-entry keeps the token.
// (owner is the hold's identity: each hold of an owner is its own, and its
// re-entries and releases are its operations.)
type reentrantState struct {
	owner string
	count int
	tok   uint64
	last  uint64
}

var reentrantModel = porcupine.Model{
	Init: func() any { return reentrantState{} },
	Step: func(st, in, _ any) (bool, any) {
		s, o := st.(reentrantState), in.(input)
		switch o.kind {
		case opAcquire:
			switch s.owner {
			case "":
				if o.tok == 0 || o.tok <= s.last {
					return false, s
				}
				return true, reentrantState{owner: o.who, count: 1, tok: o.tok, last: o.tok}
			case o.who:
				if o.tok != s.tok {
					return false, s
				}
				s.count++
				return true, s
			}
			return false, s
		case opRelease:
			if s.owner != o.who {
				return false, s
			}
			if s.count--; s.count == 0 {
				s.owner, s.tok = "", 0
			}
			return true, s
		case opEnd:
			if s.owner != o.who {
				return false, s
			}
			s.owner, s.count, s.tok = "", 0, 0
			return true, s
		}
		return false, s
	},
	Equal: func(a, b any) bool { return a.(reentrantState) == b.(reentrantState) },
	Hash: func(st any) uint64 {
		s := st.(reentrantState)
		return hashUint(hashUint(hashUint(hashString(fnvOffset, s.owner), uint64(s.count)), s.tok), s.last)
	},
	DescribeOperation:         describeOp,
	DescribeOperationMetadata: describeMeta,
	DescribeState: func(st any) string {
		s := st.(reentrantState)
		if s.owner == "" {
			return fmt.Sprintf("free, last tok %d", s.last)
		}
		return fmt.Sprintf("held by %s x%d, tok %d", s.owner, s.count, s.tok)
	},
}

// readerCount is one read hold's count.
type readerCount struct {
	owner string // the read hold's identity
	n     int
}

// rwState: one write hold (reentrant) or read holds (reentrant). The
// writer's owner may also read (downgrade); a reader may not take the write
// lock (ErrUpgrade). readers is sorted and never shared between states.
type rwState struct {
	writer  string // the write hold's identity
	wowner  string // its owner
	wcount  int
	wtok    uint64
	last    uint64
	readers []readerCount
}

func (s rwState) readersOf(o string) int {
	for _, r := range s.readers {
		if r.owner == o {
			return r.n
		}
	}
	return 0
}

// withReader returns s with owner o's read count set to n (0 removes it).
func (s rwState) withReader(o string, n int) rwState {
	rs := make([]readerCount, 0, len(s.readers)+1)
	done := false
	for _, r := range s.readers {
		if !done && r.owner >= o {
			if n > 0 {
				rs = append(rs, readerCount{o, n})
			}
			done = true
			if r.owner == o {
				continue
			}
		}
		rs = append(rs, r)
	}
	if !done && n > 0 {
		rs = append(rs, readerCount{o, n})
	}
	s.readers = rs
	return s
}

var rwModel = porcupine.Model{
	Init: func() any { return rwState{} },
	Step: func(st, in, _ any) (bool, any) {
		s, o := st.(rwState), in.(input)
		switch {
		case o.kind == opAcquire && o.read:
			if s.writer != "" && s.wowner != o.owner {
				return false, s
			}
			return true, s.withReader(o.who, s.readersOf(o.who)+1)
		case o.kind == opAcquire:
			switch {
			case s.writer == o.who:
				if o.tok != s.wtok {
					return false, s
				}
				s.wcount++
				return true, s
			case s.writer == "" && len(s.readers) == 0 && o.tok != 0 && o.tok > s.last:
				s.writer, s.wowner, s.wcount, s.wtok, s.last = o.who, o.owner, 1, o.tok, o.tok
				return true, s
			}
			return false, s
		case o.kind == opRelease && o.read:
			n := s.readersOf(o.who)
			if n == 0 {
				return false, s
			}
			return true, s.withReader(o.who, n-1)
		case o.kind == opRelease:
			if s.writer != o.who {
				return false, s
			}
			if s.wcount--; s.wcount == 0 {
				s.writer, s.wowner, s.wtok = "", "", 0
			}
			return true, s
		case o.kind == opEnd && o.read:
			if s.readersOf(o.who) == 0 {
				return false, s
			}
			return true, s.withReader(o.who, 0)
		case o.kind == opEnd:
			if s.writer != o.who {
				return false, s
			}
			s.writer, s.wowner, s.wcount, s.wtok = "", "", 0, 0
			return true, s
		}
		return false, s
	},
	Equal: func(a, b any) bool {
		x, y := a.(rwState), b.(rwState)
		return x.writer == y.writer && x.wowner == y.wowner && x.wcount == y.wcount && x.wtok == y.wtok && x.last == y.last &&
			slices.Equal(x.readers, y.readers)
	},
	Hash: func(st any) uint64 {
		s := st.(rwState)
		h := hashUint(hashUint(hashUint(hashString(fnvOffset, s.writer), uint64(s.wcount)), s.wtok), s.last)
		for _, r := range s.readers {
			h = hashUint(hashString(h, r.owner), uint64(r.n))
		}
		return h
	},
	DescribeOperation:         describeOp,
	DescribeOperationMetadata: describeMeta,
	DescribeState: func(st any) string {
		s := st.(rwState)
		var parts []string
		if s.writer != "" {
			parts = append(parts, fmt.Sprintf("writer %s x%d tok %d", s.writer, s.wcount, s.wtok))
		}
		for _, r := range s.readers {
			parts = append(parts, fmt.Sprintf("reader %s x%d", r.owner, r.n))
		}
		if len(parts) == 0 {
			parts = append(parts, "free")
		}
		return fmt.Sprintf("%s, last tok %d", strings.Join(parts, ", "), s.last)
	},
}

// latchModel: the count. Operations of unknown outcome may or may not have
// taken effect, so the model is nondeterministic (porcupine's power-set
// construction turns it into a Model over sets of counts).
var latchModel = (&porcupine.NondeterministicModel{
	Init: func() []any { return []any{int64(0)} },
	Step: func(st, in, _ any) []any {
		c, o := st.(int64), in.(input)
		switch o.kind {
		case opSet:
			switch {
			case o.info && c == 0:
				return []any{c, o.n}
			case o.info:
				return []any{c}
			case o.set && c == 0:
				return []any{o.n}
			case !o.set && c > 0:
				return []any{c}
			}
			return nil
		case opCountDown:
			next := max(c-1, 0)
			if o.info && next != c {
				return []any{c, next}
			}
			return []any{next}
		case opAwait:
			if c == 0 {
				return []any{c}
			}
			return nil
		case opDelete:
			if o.info && c != 0 {
				return []any{c, int64(0)}
			}
			return []any{int64(0)}
		case opReset:
			return []any{int64(0)}
		}
		return nil
	},
	Equal:                     func(a, b any) bool { return a.(int64) == b.(int64) },
	Hash:                      func(st any) uint64 { return hashUint(fnvOffset, uint64(st.(int64))) },
	DescribeOperation:         describeOp,
	DescribeOperationMetadata: describeMeta,
	DescribeState:             func(st any) string { return fmt.Sprintf("count %d", st.(int64)) },
}).ToModel()
