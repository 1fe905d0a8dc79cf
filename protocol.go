package dlock

import (
	"strconv"
	"strings"
	"time"
)

// This file owns dlock's two wire formats between Go and the Lua scripts:
// the release message published on a lock's channel, and the lease specs the
// renewal script checks. internal/scripts/lib.lua builds the same formats on the Lua
// side; a change here must be made there too.

// releaseMsg is what a release publishes on the lock's channel so that the
// Clients of waiting callers wake the right ones. It reads
//
//	from|n|kind|ids|fence|ttl
//
// from is the releasing Client's ID (a Client ignores its own messages: it
// wakes its own waiters directly). The waiters to wake are those named in
// ids (comma-separated), or else the n oldest (0: all) of the given kind
// (empty: any). Kind kindHanded says that the release handed the lock to the
// holder IDs listed, with the fencing token fence and a lease of ttl ms: a
// waiter of such an ID then holds it without asking again, the waiters of
// an owner of such an ID claim it, and every other waiter on the lock knows
// when the new hold ends at the latest. A message from nobody (empty from)
// is applied by every Client, the sender's too. Trailing fields may be left
// out; a missing n means 1.
type releaseMsg struct {
	from string
	wake wakeSpec
}

// encode returns the message as scripts publish it.
func (m releaseMsg) encode() string {
	var b strings.Builder
	b.WriteString(m.from)
	b.WriteByte('|')
	b.WriteString(strconv.Itoa(m.wake.n))
	if m.wake.kind != kindAny || len(m.wake.ids) > 0 {
		b.WriteByte('|')
		if m.wake.kind != kindAny {
			b.WriteByte(m.wake.kind)
		}
	}
	if len(m.wake.ids) > 0 {
		b.WriteByte('|')
		b.WriteString(strings.Join(m.wake.ids, ","))
	}
	if m.wake.fence != 0 || m.wake.ttl > 0 {
		b.WriteByte('|')
		b.WriteString(strconv.FormatUint(m.wake.fence, 10))
	}
	if m.wake.ttl > 0 {
		b.WriteByte('|')
		b.WriteString(strconv.FormatInt(m.wake.ttl.Milliseconds(), 10))
	}
	return b.String()
}

// decodeRelease parses a release message. A malformed one wakes one waiter
// of any kind: waking too many costs a retry, waking none could strand one.
func decodeRelease(payload string) releaseMsg {
	from, rest, _ := strings.Cut(payload, "|")
	nField, rest, _ := strings.Cut(rest, "|")
	kindField, rest, _ := strings.Cut(rest, "|")
	idsField, rest, _ := strings.Cut(rest, "|")
	fenceField, ttlField, _ := strings.Cut(rest, "|")
	m := releaseMsg{from: from, wake: wakeSpec{n: 1}}
	m.wake.fence, _ = strconv.ParseUint(fenceField, 10, 64)
	if ms, err := strconv.ParseInt(ttlField, 10, 64); err == nil && ms > 0 {
		m.wake.ttl = time.Duration(ms) * time.Millisecond
	}
	if n, err := strconv.Atoi(nField); err == nil {
		m.wake.n = n
	}
	if len(kindField) == 1 {
		m.wake.kind = kindField[0]
	}
	if idsField != "" {
		m.wake.ids = strings.Split(idsField, ",")
	}
	return m
}

// wakeSpec is whom a release wakes: the waiters named in ids, or else n
// waiters (0: all) of the given kind (kindAny: any kind). With ids, kind
// kindHanded says the release handed the lock to them, with the fencing
// token fence and a lease of ttl.
type wakeSpec struct {
	n     int
	kind  byte
	ids   []string
	fence uint64
	ttl   time.Duration
}

// Waiter kinds, for release messages that wake only one kind.
const (
	kindAny    byte = 0
	kindReader byte = 'r'
	kindWriter byte = 'w'
	kindHanded byte = 'g' // not a waiter kind: the named waiters now hold the lock
	// kindObserver: an Election's observers, woken only by messages of their
	// own kind (a new leader's notice, '<from>|0|o'), never counted among
	// the waiters a release wakes.
	kindObserver byte = 'o'
)

var (
	wakeOne = wakeSpec{n: 1}
	wakeAll = wakeSpec{}
)

// wakeOneMsg is the message of a release that lets one waiter of any kind
// try again.
func wakeOneMsg(from string) string { return releaseMsg{from: from, wake: wakeOne}.encode() }

// leaseSpec tells internal/scripts/renew.lua what proves that a lease is still held,
// and the watchdog which keys to send with it. The spec is one kind letter
// followed by an ID.
type leaseSpec struct {
	kind byte
	id   string
}

// Lease kinds. See internal/scripts/renew.lua for what each one checks.
const (
	// specHolder: a primitive's main key (a hash) whose field 'o', the
	// holder, is the ID (a hold of an exclusive lock).
	specHolder byte = 'o'
	// specField: a hash key holding the ID as a field (an RWMutex writer).
	specField byte = 'h'
	// specMember: a zset of leases scored by expiry in which the ID is a
	// live member (a permit).
	specMember byte = 'z'
	// specMemberWith: as specMember, plus a companion key that must live as
	// long as the zset (a read hold and its counts; a queue place and the
	// queue).
	specMemberWith byte = 'R'
	// specMemberWith2: as specMemberWith, with two companion keys (a permit:
	// a Semaphore's main key and counts; a Semaphore waiter's place: its
	// queue and main key; an RWMutex read hold: its read counts and main
	// key).
	specMemberWith2 byte = 'P'
)

func (s leaseSpec) String() string { return string(s.kind) + s.id }

// keys returns how many keys a lease of this kind sends to the renewal
// script.
func (s leaseSpec) keys() int {
	switch s.kind {
	case specMemberWith:
		return 2
	case specMemberWith2:
		return 3
	}
	return 1
}
