package wire

import (
	"strconv"
	"strings"
	"time"
)

// A waiter is how a blocked caller is named in a primitive's queue in
// Redis. Exclusive locks (Mutex, ReentrantMutex, Election) queue
//
//	<lease>[+<reserve>]:<id>
//
// the fixed lease the caller asked for, in ms (0: renewed by the
// watchdog), the number of fencing tokens to reserve after its own when it
// is granted (a cohorting Mutex: see engine's cohort), and the ID it will
// hold the lock under. An RWMutex queues
//
//	<lease>[+<reserve>]:<r|w><id>
//
// its lease, the tokens a writer reserves (as above), whether it reads or
// writes, and a reader's owner ID or a writer's grant ID (the ID of its
// write hold: see engine's Reentrant). lib.lua's parse_waiter and parse_rw
// read them.

// ExclWaiter names a waiter of an exclusive lock.
func ExclWaiter(lease time.Duration, reserve int, id string) string {
	var b strings.Builder
	b.WriteString(strconv.FormatInt(Millis(lease), 10))
	if reserve > 0 {
		b.WriteByte('+')
		b.WriteString(strconv.Itoa(reserve))
	}
	b.WriteByte(':')
	b.WriteString(id)
	return b.String()
}

// ParseExclWaiter reads a name ExclWaiter wrote; ok is false for anything
// else.
func ParseExclWaiter(w string) (lease time.Duration, reserve int, id string, ok bool) {
	head, id, ok := strings.Cut(w, ":")
	if !ok {
		return 0, 0, "", false
	}
	head, res, hasReserve := strings.Cut(head, "+")
	ms, err := strconv.ParseInt(head, 10, 64)
	if err != nil || ms < 0 {
		return 0, 0, "", false
	}
	if hasReserve {
		if reserve, err = strconv.Atoi(res); err != nil || reserve < 0 {
			return 0, 0, "", false
		}
	}
	return time.Duration(ms) * time.Millisecond, reserve, id, true
}

// RWReader names a reader of an RWMutex waiting, by its owner.
func RWReader(lease time.Duration, owner string) string {
	return strconv.FormatInt(Millis(lease), 10) + ":r" + owner
}

// RWWriter names a writer of an RWMutex waiting, by the grant ID it will
// hold the lock under, with reserve tokens reserved after its own.
func RWWriter(lease time.Duration, reserve int, id string) string {
	return ExclWaiter(lease, reserve, "w"+id)
}

// ParseRWWaiter reads a name RWReader or RWWriter wrote; ok is false for
// anything else.
func ParseRWWaiter(w string) (lease time.Duration, reserve int, write bool, id string, ok bool) {
	lease, reserve, rest, ok := ParseExclWaiter(w)
	if !ok || rest == "" || rest[0] != 'r' && rest[0] != 'w' || rest[0] == 'r' && reserve > 0 {
		return 0, 0, false, "", false
	}
	return lease, reserve, rest[0] == 'w', rest[1:], true
}

// Millis converts d to whole milliseconds, as PX and PEXPIRE take them,
// rounding up so that no positive lease becomes zero.
func Millis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}
