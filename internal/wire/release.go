package wire

import (
	"strconv"
	"strings"
	"time"
)

// Release is what a release publishes on a primitive's channel, so that
// the Clients of waiting callers wake the right ones. It reads
//
//	from|n|kind|ids|fence|ttl
//
// From is the releasing Client's ID (a Client ignores its own messages: it
// wakes its own waiters directly); Wake says whom to wake. A message from
// nobody (empty From) is applied by every Client, the sender's too.
// Trailing fields may be left out; a missing n means 1. lib.lua's msg_*
// functions write it.
type Release struct {
	From string
	Wake Wake
}

// Wake is whom a release wakes: the waiters named in IDs, or else N waiters
// (0: all) of the given kind (KindAny: any). With IDs, KindHanded says the
// release handed the lock to them, with the fencing token Fence and a lease
// of TTL: a waiter of such an ID then holds it without asking again, the
// waiters of an owner of such an ID claim it, and every other waiter of the
// lock knows when the new hold ends at the latest.
type Wake struct {
	N     int
	Kind  byte
	IDs   []string
	Fence uint64
	TTL   time.Duration
}

// Waiter kinds, for release messages that wake only one kind.
const (
	KindAny    byte = 0
	KindReader byte = 'r'
	KindWriter byte = 'w'
	KindHanded byte = 'g' // not a waiter kind: the named waiters now hold the lock
	// KindReleased: not a waiter kind: the hold of the one holder ID
	// listed was released (a Redlock master's release; one comes from each
	// master that had the key), or, with its token as the fence, taken
	// away by a ForceUnlock.
	KindReleased byte = 'x'
	// KindObserver: an Election's observers, woken only by messages of their
	// own kind (a new leader's notice, '<from>|0|o'), never counted among the
	// waiters a release wakes.
	KindObserver byte = 'o'
	// KindQueued: not a waiter kind: the first waiter, since a grant that
	// found nobody queued, whom the holder's cohort would not serve queued
	// ('<from>|0|q', excl_try). It wakes nobody; a Client whose cohort holds
	// the lock past its time bound learns from it that another waits.
	KindQueued byte = 'q'
)

// WakeOne and WakeAll wake one waiter of any kind, and every waiter.
var (
	WakeOne = Wake{N: 1}
	WakeAll = Wake{}
)

// Encode returns the message as scripts publish it.
func (m Release) Encode() string {
	var b strings.Builder
	b.WriteString(m.From)
	b.WriteByte('|')
	b.WriteString(strconv.Itoa(m.Wake.N))
	if m.Wake.Kind != KindAny || len(m.Wake.IDs) > 0 {
		b.WriteByte('|')
		if m.Wake.Kind != KindAny {
			b.WriteByte(m.Wake.Kind)
		}
	}
	if len(m.Wake.IDs) > 0 {
		b.WriteByte('|')
		b.WriteString(strings.Join(m.Wake.IDs, ","))
	}
	if m.Wake.Fence != 0 || m.Wake.TTL > 0 {
		b.WriteByte('|')
		b.WriteString(strconv.FormatUint(m.Wake.Fence, 10))
	}
	if m.Wake.TTL > 0 {
		b.WriteByte('|')
		b.WriteString(strconv.FormatInt(m.Wake.TTL.Milliseconds(), 10))
	}
	return b.String()
}

// DecodeRelease parses a release message. A malformed one wakes one waiter
// of any kind: waking too many costs a retry, waking none could strand one.
func DecodeRelease(payload string) Release {
	from, rest, _ := strings.Cut(payload, "|")
	nField, rest, _ := strings.Cut(rest, "|")
	kindField, rest, _ := strings.Cut(rest, "|")
	idsField, rest, _ := strings.Cut(rest, "|")
	fenceField, ttlField, _ := strings.Cut(rest, "|")
	m := Release{From: from, Wake: Wake{N: 1}}
	m.Wake.Fence, _ = strconv.ParseUint(fenceField, 10, 64)
	if ms, err := strconv.ParseInt(ttlField, 10, 64); err == nil && ms > 0 {
		m.Wake.TTL = time.Duration(ms) * time.Millisecond
	}
	if n, err := strconv.Atoi(nField); err == nil {
		m.Wake.N = n
	}
	if len(kindField) == 1 {
		m.Wake.Kind = kindField[0]
	}
	if idsField != "" {
		m.Wake.IDs = strings.Split(idsField, ",")
	}
	return m
}

// WakeOneMsg is the message of a release that lets one waiter of any kind
// try again.
func WakeOneMsg(from string) string { return Release{From: from, Wake: WakeOne}.Encode() }
