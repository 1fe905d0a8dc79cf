package check

import (
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/dlock-go/dlock/internal/torture/history"
)

// inf stands for "never" on the history's clock.
const inf int64 = math.MaxInt64

// span is a closed interval of the shared clock; to may be inf.
type span struct{ from, to int64 }

// endKind says how a hold ended.
type endKind uint8

const (
	endOpen        endKind = iota // still held when the history ends
	endRelease                    // released, OK
	endReleaseInfo                // a release of unknown outcome (or that never completed)
	endReleaseFail                // a release refused: the hold was already gone
	endLost                       // a Point Lost
	endVanished                   // the owner was granted a fresh hold while this one (exempted) seemed open
	endPaused                     // exemption: a process of the hold was paused
	endDataLoss                   // exemption: the server lost its data
)

var endNames = [...]string{"still held", "released", "release unknown", "release refused", "lost", "vanished", "paused", "data loss"}

func (k endKind) String() string { return endNames[k] }

// holdState is where the hold builder is with a hold.
type holdState uint8

const (
	stOpen      holdState = iota // held: no release, no Lost yet
	stReleasing                  // a release of unknown outcome or refused: waiting for a Lost to date the end
	stLost                       // ended by Lost; a release invoked before the Lost may still come in
	stDone                       // nothing more attaches to it
)

// stepKind is a reentrant or RW step inside a hold.
type stepKind uint8

const (
	stepLock   stepKind = iota // a re-entry
	stepUnlock                 // a release that left the count above 0
)

// step is an operation inside a hold that neither starts nor ends it.
type step struct {
	kind stepKind
	at   span
	tok  uint64
	proc int
	ev   int // completion event index (or invoke, if none)
}

// hold is one hold of a lock, a permit or a leadership, from the history.
type hold struct {
	id      int
	space   string
	name    string
	prim    string
	holder  string   // the acquiring holder: the model's identity of the hold
	holders []string // holder and, after hand-overs, the new ones
	read    bool     // an RW read hold
	procs   []int    // the acquiring process first, then hand-over processes
	tok     uint64
	n       int64 // semaphore permits
	acq     span  // [acquire invoke, acquire completion]
	acqEv   int   // completion event index
	count   int   // reentrant / RW hold count
	steps   []step
	state   holdState

	// The end, untruncated, by the rules of the package doc.
	kind     endKind
	end      span  // the end as an operation of the model
	endStart int64 // when the end started: release invoke, Lost T (the earliest)
	freeAt   int64 // when the lock was known free again: release completion, Lost T
	endEv    int   // the event that ended it (-1: none)
	relInv   int64 // a pending release's invocation
	relEv    int
	lostT    int64
	hasLost  bool
	// A hand-over not yet claimed: from handedT until the bearer's Claimed
	// point nobody acts on the hold, and it may end at any moment.
	handedT  int64
	claimed  bool
	lateUsed bool // a release invoked before the Lost already attached

	// The exemption, if any: the model end is then exEnd, not end.
	exempt endKind // endPaused or endDataLoss; endOpen: none
	exEnd  span
	exEv   int
}

// modelEnd returns the end the models and the semaphore sweep use: the
// exemption's when there is one, from the call of a release that may have
// ended the hold before the fault (its outcome ok or unknown). ok is false
// when the hold never ended.
func (h *hold) modelEnd() (sp span, kind endKind, ok bool) {
	if h.exempt != endOpen {
		sp = h.exEnd
		if (h.kind == endRelease || h.kind == endReleaseInfo) && h.endStart < sp.from {
			sp.from = h.endStart
		}
		return sp, h.exempt, true
	}
	return h.end, h.kind, h.kind != endOpen
}

func (h *hold) hasProc(p int) bool {
	for _, q := range h.procs {
		if q == p {
			return true
		}
	}
	return false
}

// Functions that start and end holds.
var (
	acquireFns = map[string]bool{history.Lock: true, history.TryLock: true, history.RLock: true,
		history.TryRLock: true, history.Acquire: true, history.TryAcquire: true}
	releaseFns = map[string]bool{history.Unlock: true, history.RUnlock: true, history.Release: true}
	// blockingFns wait for the lock (liveness).
	blockingFns = map[string]bool{history.Lock: true, history.RLock: true, history.Acquire: true}
)

// exclusiveSpaces exclude other holders (all the lock spaces but the
// semaphore's and the latch's).
var (
	exclusiveSpaces = map[string]bool{history.Mutex: true, history.Redlock: true, history.Sentinel: true,
		history.Election: true, history.Reentrant: true, history.RW: true}
	// dataLossSpaces: which spaces a nemesis function wipes.
	dataLossSpaces = map[string][]string{
		history.KillRedis:     {history.Mutex, history.Reentrant, history.RW, history.Semaphore, history.Latch, history.Election},
		history.FailoverStart: {history.Sentinel},
	}
)

// readSide reports whether an acquisition or release function is an RW
// read one.
func readSide(space, f string) bool {
	return space == history.RW && (f == history.RLock || f == history.TryRLock || f == history.RUnlock)
}

func holdKey(space, name, holder string, read bool) string {
	side := "w"
	if read {
		side = "r"
	}
	return space + "\x00" + name + "\x00" + holder + "\x00" + side
}

func (r *run) latest(key string) *hold {
	hs := r.byKey[key]
	if len(hs) == 0 {
		return nil
	}
	return hs[len(hs)-1]
}

func (r *run) register(key, holder string, h *hold) {
	if _, ok := r.byKey[key]; !ok {
		r.keysOf[holder] = append(r.keysOf[holder], key)
	}
	r.byKey[key] = append(r.byKey[key], h)
}

// keysFor returns the keys of holder's holds in space (any space when
// space is ""), on name (any when ""), on the given side.
func (r *run) keysFor(holder, space, name string, read bool) []string {
	if space != "" && name != "" {
		return []string{holdKey(space, name, holder, read)}
	}
	var out []string
	for _, k := range r.keysOf[holder] {
		p := strings.Split(k, "\x00")
		if (space == "" || p[0] == space) && (name == "" || p[1] == name) && (p[0] != history.RW || (p[3] == "r") == read) {
			out = append(out, k)
		}
	}
	return out
}

// buildHolds reads the history once, in time order, into r.holds.
func (r *run) buildHolds() {
	r.byKey, r.keysOf = map[string][]*hold{}, map[string][]string{}
	r.open = map[*hold]struct{}{}
	r.pauses, r.dataLoss = map[int][]int{}, map[string][]int{}
	r.early, r.earlyUsed = map[string][]int{}, map[int]bool{}
	for i, e := range r.evs {
		switch e.Kind {
		case history.Invoke:
			// A release that never completed is one of unknown outcome,
			// dated from its invocation.
			if r.doneOf[i] < 0 && releaseFns[e.F] && e.Prim != history.Nemesis {
				r.released(r.callAt(i))
			}
		case history.OK, history.Fail, history.Info:
			inv := r.invOf[i]
			if inv < 0 || e.Prim == history.Nemesis || e.Prim == history.Latch {
				continue
			}
			c := r.callAt(inv)
			switch {
			case acquireFns[c.inv.F] && e.Kind == history.OK:
				r.acquired(c)
			case releaseFns[c.inv.F]:
				r.released(c)
			}
		case history.Point:
			r.point(i)
		}
	}
	for _, h := range r.holds {
		r.finalize(h)
	}
}

func (r *run) acquired(c call) {
	prim := c.inv.Prim
	space := history.Space(prim)
	holder := c.holder()
	if prim == history.MultiLock {
		toks := c.toks()
		for _, name := range c.names() {
			r.newHold(c, space, name, holder, false, toks[name])
		}
		return
	}
	read := readSide(space, c.inv.F)
	key := holdKey(space, c.name(), holder, read)
	if space == history.Reentrant || space == history.RW {
		if h := r.latest(key); h != nil {
			tok, n := c.tok(), c.n()
			switch {
			case h.state == stOpen && h.exempt != endOpen && (n == 1 || (tok != 0 && tok != h.tok)):
				// The owner was granted a fresh hold: the exempted one
				// had expired meanwhile, as the exemption allows.
				r.vanishedAfterExc++
				h.kind, h.end, h.endStart, h.freeAt, h.endEv = endVanished, span{c.inv.T, c.inv.T}, c.inv.T, c.inv.T, c.ev()
				h.state = stDone
				delete(r.open, h)
			case h.state == stOpen:
				// A re-entry: the model checks its token.
				h.count++
				h.steps = append(h.steps, step{stepLock, span{c.inv.T, c.done.T}, tok, c.inv.Proc, c.ev()})
				return
			case (h.state == stLost || h.state == stReleasing) && tok != 0 && tok == h.tok && n != 1:
				// A re-entry of a hold the owner was told it lost, or
				// whose release failed or had an unknown outcome: the
				// server still had it (only a re-entry repeats a token),
				// so it did not end there. It goes on.
				r.revived++
				h.state, h.kind, h.end, h.endStart, h.freeAt, h.endEv = stOpen, endOpen, span{}, 0, 0, -1
				h.hasLost, h.lateUsed = false, false
				r.open[h] = struct{}{}
				h.count++
				h.steps = append(h.steps, step{stepLock, span{c.inv.T, c.done.T}, tok, c.inv.Proc, c.ev()})
				return
			}
		}
	}
	r.newHold(c, space, c.name(), holder, read, c.tok())
}

func (r *run) newHold(c call, space, name, holder string, read bool, tok uint64) {
	key := holdKey(space, name, holder, read)
	if old := r.latest(key); old != nil && (old.state == stReleasing || old.state == stLost) {
		r.finalize(old) // no Lost or late release can come for it any more
	}
	n := c.n()
	if space == history.Semaphore && n <= 0 {
		n = 1
	}
	h := &hold{
		id: len(r.holds), space: space, name: name, prim: c.inv.Prim, holder: holder, holders: []string{holder},
		read: read, procs: []int{c.inv.Proc}, tok: tok, n: n, acq: span{c.inv.T, c.done.T}, acqEv: c.doneIdx,
		count: 1, endEv: -1, exEv: -1,
	}
	r.holds = append(r.holds, h)
	r.register(key, holder, h)
	r.open[h] = struct{}{}
	// A fault while the acquisition was pending: the lock may have been
	// taken before it, so the hold may have ended by it.
	first := -1
	if ps := r.pauses[c.inv.Proc]; len(ps) > 0 {
		first = r.firstIn(ps, h.acq)
	}
	if dl := r.firstIn(r.dataLoss[space], h.acq); dl >= 0 && (first < 0 || dl < first) {
		first = dl
	}
	if first >= 0 {
		kind := endPaused
		if r.evs[first].F != history.Pause {
			kind = endDataLoss
		}
		r.exemptHold(h, first, kind, span{r.evs[first].T, h.acq.to})
	}
	// A Lost recorded while the acquisition was pending (the process
	// recorded the two concurrently, a pause between them): it is this
	// hold's. Only where a holder names one hold: a reentrant or RW
	// owner's Lost may be its previous hold's.
	if space == history.Reentrant || space == history.RW {
		return
	}
	for j, i := range r.early[holder] {
		e := &r.evs[i]
		if e.T >= h.acq.from && e.T <= h.acq.to && r.lostMatches(e, h) {
			if e.Prim != history.MultiLock { // a MultiLock's ends every member
				r.early[holder] = append(r.early[holder][:j:j], r.early[holder][j+1:]...)
			}
			if !r.earlyUsed[i] {
				r.earlyUsed[i] = true
				r.lostWithoutHold--
			}
			r.lostHold(h, i)
			break
		}
	}
}

// lostMatches reports whether Lost point e may be for hold h.
func (r *run) lostMatches(e *history.Event, h *hold) bool {
	if e.Prim != "" && history.Space(e.Prim) != h.space {
		return false
	}
	if e.Name != "" && e.Prim != history.MultiLock && e.Name != h.name {
		return false
	}
	return h.space != history.RW || e.Read == h.read
}

// firstIn returns the first of the event indexes idx (in time order) that
// falls in sp, or -1.
func (r *run) firstIn(idx []int, sp span) int {
	k := sort.Search(len(idx), func(i int) bool { return r.evs[idx[i]].T >= sp.from })
	if k < len(idx) && r.evs[idx[k]].T <= sp.to {
		return idx[k]
	}
	return -1
}

func (r *run) exemptHold(h *hold, ev int, kind endKind, sp span) {
	if h.exempt != endOpen {
		return
	}
	h.exempt, h.exEnd, h.exEv = kind, sp, ev
}

func (r *run) released(c call) {
	prim := c.inv.Prim
	space := history.Space(prim)
	read := readSide(space, c.inv.F)
	name := c.name()
	if prim == history.MultiLock {
		name = ""
	}
	found := false
	for _, key := range r.keysFor(c.holder(), space, name, read) {
		h := r.latest(key)
		if h == nil {
			continue
		}
		found = r.releaseHold(h, c) || found
	}
	if !found {
		r.releaseAfterEnd++
	}
}

func (r *run) releaseHold(h *hold, c call) bool {
	inv, done, k := c.inv.T, c.doneT(r.horizon), c.kind()
	counted := h.space == history.Reentrant || h.space == history.RW
	switch h.state {
	case stOpen:
		if k == history.OK && counted && h.count > 1 {
			h.count--
			h.steps = append(h.steps, step{stepUnlock, span{inv, done}, 0, c.inv.Proc, c.ev()})
			return true
		}
		delete(r.open, h)
		switch k {
		case history.OK:
			h.kind, h.end, h.endStart, h.freeAt, h.endEv, h.state = endRelease, span{inv, done}, inv, done, c.ev(), stDone
		case history.Info:
			h.kind, h.relInv, h.relEv, h.state = endReleaseInfo, inv, c.ev(), stReleasing
		default:
			h.kind, h.relInv, h.relEv, h.state = endReleaseFail, inv, c.ev(), stReleasing
		}
		return true
	case stLost:
		if h.lateUsed || inv >= h.lostT {
			return false
		}
		// A release invoked before the Lost: the end is the earliest.
		h.lateUsed = true
		switch k {
		case history.OK:
			if counted && h.count > 1 {
				h.count--
				h.steps = append(h.steps, step{stepUnlock, span{inv, done}, 0, c.inv.Proc, c.ev()})
				h.lateUsed = false
				return true
			}
			h.kind, h.end, h.endStart, h.freeAt, h.endEv = endRelease, span{inv, done}, inv, min(done, h.lostT), c.ev()
		case history.Info:
			h.kind, h.end, h.endStart, h.endEv = endReleaseInfo, span{inv, h.lostT}, inv, c.ev()
		default:
			h.endStart = inv
		}
		return true
	}
	return false
}

// finalize settles a hold that nothing more can end.
func (r *run) finalize(h *hold) {
	switch h.state {
	case stOpen:
		h.kind, h.end, h.endStart, h.freeAt = endOpen, span{inf, inf}, inf, inf
	case stReleasing:
		if h.kind == endReleaseInfo {
			h.end, h.endStart, h.freeAt = span{h.relInv, inf}, h.relInv, inf
		} else {
			h.end, h.endStart, h.freeAt = span{h.relInv, h.relInv}, h.relInv, h.relInv
		}
		h.endEv = h.relEv
	}
	h.state = stDone
	delete(r.open, h)
}

func (r *run) point(i int) {
	e := &r.evs[i]
	switch {
	case e.F == history.Lost:
		r.lost(i)
	case e.F == history.Handed:
		r.handed(i)
	case e.F == history.Claimed:
		r.claimed(i)
	case !nemesis(e):
	case e.F == history.Pause:
		p, err := strconv.Atoi(e.Target)
		if err != nil {
			return
		}
		r.pauses[p] = append(r.pauses[p], i)
		for h := range r.open {
			if h.hasProc(p) {
				r.exemptHold(h, i, endPaused, span{e.T, e.T})
			}
		}
	case dataLossSpaces[e.F] != nil:
		for _, s := range dataLossSpaces[e.F] {
			r.dataLoss[s] = append(r.dataLoss[s], i)
		}
		for h := range r.open {
			for _, s := range dataLossSpaces[e.F] {
				if h.space == s {
					r.exemptHold(h, i, endDataLoss, span{e.T, e.T})
				}
			}
		}
	}
}

func (r *run) lost(i int) {
	e := &r.evs[i]
	space, name := "", e.Name
	if e.Prim != "" {
		space = history.Space(e.Prim)
	}
	if e.Prim == history.MultiLock {
		name = ""
	}
	read := space == history.RW && e.Read
	found := false
	for _, key := range r.keysFor(e.Holder, space, name, read) {
		if h := r.latest(key); h != nil && r.lostHold(h, i) {
			found = true
		}
	}
	if !found {
		r.lostWithoutHold++
		r.early[e.Holder] = append(r.early[e.Holder], i)
	}
}

// lostHold ends h by Lost point i, if h is still held or being released.
func (r *run) lostHold(h *hold, i int) bool {
	e := &r.evs[i]
	switch h.state {
	case stOpen:
		delete(r.open, h)
		h.kind, h.end, h.endStart, h.freeAt, h.endEv, h.state = endLost, span{e.T, e.T}, e.T, e.T, i, stLost
		if h.handedT > 0 && !h.claimed {
			// Handed over and never claimed: the hold ended at some moment
			// since the hand-over, which nobody acted on.
			h.end, h.endStart = span{h.handedT, e.T}, h.handedT
		}
	case stReleasing:
		// The release's outcome was unknown or refused: the Lost dates
		// the end.
		if h.kind == endReleaseInfo {
			h.end, h.endStart, h.freeAt = span{h.relInv, e.T}, h.relInv, e.T
		} else {
			h.end, h.endStart, h.freeAt = span{e.T, e.T}, h.relInv, e.T
		}
		// Its release is in: no late one to wait for.
		h.endEv, h.state, h.lateUsed = i, stLost, true
	default:
		return false
	}
	h.lostT, h.hasLost = e.T, true
	return true
}

// claimed records that the bearer of a handed hold claimed it.
func (r *run) claimed(i int) {
	e := &r.evs[i]
	for _, key := range r.keysFor(e.Holder, history.Mutex, "", false) {
		if h := r.latest(key); h != nil && h.state == stOpen {
			h.claimed = true
		}
	}
}

func (r *run) handed(i int) {
	e := &r.evs[i]
	if e.NewHolder == "" {
		return
	}
	for _, key := range r.keysFor(e.Holder, history.Mutex, "", false) {
		h := r.latest(key)
		if h == nil || h.state != stOpen {
			continue
		}
		h.holders = append(h.holders, e.NewHolder)
		h.handedT, h.claimed = e.T, false
		if !h.hasProc(e.Proc) && e.Proc >= 0 {
			h.procs = append(h.procs, e.Proc)
		}
		r.register(holdKey(h.space, h.name, e.NewHolder, h.read), e.NewHolder, h)
	}
}
