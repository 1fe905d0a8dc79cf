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
//	<lease>:<r|w><owner>
//
// its lease, whether it reads or writes, and its owner ID. lib.lua's
// parse_waiter and parse_rw read them.

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

// RWWaiter names a waiter of an RWMutex: a writer when write, else a
// reader.
func RWWaiter(lease time.Duration, write bool, owner string) string {
	role := "r"
	if write {
		role = "w"
	}
	return strconv.FormatInt(Millis(lease), 10) + ":" + role + owner
}

// ParseRWWaiter reads a name RWWaiter wrote; ok is false for anything else.
func ParseRWWaiter(w string) (lease time.Duration, write bool, owner string, ok bool) {
	head, rest, ok := strings.Cut(w, ":")
	if !ok || rest == "" || rest[0] != 'r' && rest[0] != 'w' {
		return 0, false, "", false
	}
	ms, err := strconv.ParseInt(head, 10, 64)
	if err != nil || ms < 0 {
		return 0, false, "", false
	}
	return time.Duration(ms) * time.Millisecond, rest[0] == 'w', rest[1:], true
}

// Millis converts d to whole milliseconds, as PX and PEXPIRE take them,
// rounding up so that no positive lease becomes zero.
func Millis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}
