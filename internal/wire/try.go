package wire

import (
	"fmt"
	"strconv"
	"time"
)

// Try is an acquiring script's reply (excl_try, rw_try_*, sem_try,
// sem_drain, redlock's try), as lib.lua's held and busy write it:
//
//	token               a new hold, count 1, with that fencing token
//	                    (excl_try's hot path: the shortest reply; nobody
//	                    had queued since the lock was last free)
//	{1, count, token}   held: the caller's hold count (a drain's permits),
//	                    and its fencing token ('' for a read hold)
//	{0, left, holder, token, queued, flags}
//	                    refused: what the blocking lease has left in ms (0:
//	                    unknown or no expiry), the holder's ID and token (''
//	                    when none), 1 when this try queued the caller anew,
//	                    and a primitive's flags ('unset': a semaphore whose
//	                    total was never set)
type Try struct {
	Held   bool
	Count  int64  // held: the caller's hold count, or permits
	Token  uint64 // held: the hold's fencing token; refused: the holder's, when known
	Left   time.Duration
	Holder string // refused: whose hold blocks, when one does
	Queued bool   // refused: this try queued the caller anew (it had no place)
	Unset  bool   // refused: a semaphore's total was never set
	// Quiet: held, by excl_try's hot path: nobody had queued for the lock
	// since it was last free.
	Quiet bool
}

// DecodeTry reads an acquiring script's reply.
func DecodeTry(res any) (Try, error) {
	if token, ok := res.(string); ok {
		t, err := ParseToken(token)
		return Try{Held: true, Count: 1, Token: t, Quiet: true}, err
	}
	list, ok := res.([]any)
	if !ok || len(list) < 3 {
		return Try{}, fmt.Errorf("unexpected reply %v", res)
	}
	tag, _ := list[0].(int64)
	if tag == 1 {
		count, ok := list[1].(int64)
		token, ok2 := list[2].(string)
		if !ok || !ok2 {
			return Try{}, fmt.Errorf("unexpected reply %v", res)
		}
		t, err := ParseToken(token)
		return Try{Held: true, Count: count, Token: t}, err
	}
	if len(list) < 6 {
		return Try{}, fmt.Errorf("unexpected reply %v", res)
	}
	var r Try
	ms, _ := list[1].(int64)
	r.Left = time.Duration(ms) * time.Millisecond
	r.Holder, _ = list[2].(string)
	token, _ := list[3].(string)
	r.Token, _ = strconv.ParseUint(token, 10, 64)
	queued, _ := list[4].(int64)
	r.Queued = queued == 1
	flags, _ := list[5].(string)
	r.Unset = flags == "unset"
	return r, nil
}

// ParseToken reads a fencing token as a script wrote it; "" (a read hold,
// which has none) is 0.
func ParseToken(s string) (uint64, error) {
	if s == "" {
		return 0, nil
	}
	t, err := strconv.ParseUint(s, 10, 64)
	if err != nil || t == 0 {
		return 0, fmt.Errorf("unexpected fencing token %q", s)
	}
	return t, nil
}

// DecodePair reads a script's {integer, text} reply: a count and a release
// message (a semaphore's total set), or the first two fields of a releasing
// script's reply (see engine.Handle.SettleHandover). Any other length is an
// error.
func DecodePair(res []any) (int64, string, error) {
	if len(res) != 2 {
		return 0, "", fmt.Errorf("unexpected reply %v", res)
	}
	n, ok := res[0].(int64)
	msg, ok2 := res[1].(string)
	if !ok || !ok2 {
		return 0, "", fmt.Errorf("unexpected reply %v", res)
	}
	return n, msg, nil
}

// DecodeCountMessages reads a script's {integer, text...} reply: a count and
// any number of release messages (a semaphore's release, one message per
// request it served).
func DecodeCountMessages(res []any) (int64, []string, error) {
	var n int64
	ok := len(res) > 0
	if ok {
		n, ok = res[0].(int64)
	}
	msgs := make([]string, 0, max(len(res)-1, 0))
	for i := 1; ok && i < len(res); i++ {
		var msg string
		msg, ok = res[i].(string)
		msgs = append(msgs, msg)
	}
	if !ok {
		return 0, nil, fmt.Errorf("unexpected reply %v", res)
	}
	return n, msgs, nil
}
