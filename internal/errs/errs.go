// Package errs is dlock's errors: the sentinels every part of dlock
// returns (package dlock exports them, with their contracts), the error of
// one call on a named primitive (Call), and the one place that reads what
// Redis and go-redis return (Classify, FromRedis). It imports nothing of
// dlock's.
package errs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"syscall"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/pubsub"
)

// The sentinel errors, which package dlock exports under the same names
// with their contracts.
var (
	ErrNotObtained   = errors.New("dlock: not obtained")
	ErrNotHeld       = errors.New("dlock: not held")
	ErrLost          = errors.New("dlock: lock lost")
	ErrUpgrade       = errors.New("dlock: read lock cannot be upgraded")
	ErrNotFound      = errors.New("dlock: not found")
	ErrNoLeader      = errors.New("dlock: no leader")
	ErrNotReplicated = errors.New("dlock: not acknowledged by replicas")
	ErrClosed        = errors.New("dlock: client closed")
	ErrUnavailable   = errors.New("dlock: redis unavailable")
	ErrInvalid       = errors.New("dlock: invalid argument")
)

// Call is the error of one call on a named primitive. It reads
// `dlock: <op> "<name>": <what>: <detail>`, with one "dlock:" prefix however
// many of dlock's sentinels it matches.
type Call struct {
	op, name string
	detail   string  // optional, after the sentinels' texts
	errs     []error // what errors.Is and errors.As see
	shown    []error // what the message shows; errs when nil
}

func (e *Call) Error() string {
	var b strings.Builder
	b.WriteString("dlock: ")
	b.WriteString(e.op)
	b.WriteByte(' ')
	b.WriteString(strconv.Quote(CapName(e.name, NameBytes)))
	shown := e.shown
	if shown == nil {
		shown = e.errs
	}
	for _, err := range shown {
		b.WriteString(": ")
		b.WriteString(strings.TrimPrefix(err.Error(), "dlock: "))
	}
	if e.detail != "" {
		b.WriteString(": ")
		b.WriteString(e.detail)
	}
	return b.String()
}

func (e *Call) Unwrap() []error { return e.errs }

// NameBytes is the most of a name an error message quotes.
const NameBytes = 128

// CapName returns name cut to at most max bytes (at a rune boundary), with
// an ellipsis and the name's length when it was cut.
func CapName(name string, max int) string {
	if len(name) <= max {
		return name
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(name[cut]) {
		cut--
	}
	return name[:cut] + "…(" + strconv.Itoa(len(name)) + " bytes)"
}

// Op returns the error of op on the primitive called name: it matches
// every error in errs, and detail (if any) follows their texts.
func Op(op, name, detail string, errs ...error) error {
	return &Call{op: op, name: name, detail: detail, errs: errs}
}

// Invalidf returns an error matching ErrInvalid, with the formatted text
// after it.
func Invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// NotObtained is the error of a blocking acquisition whose context ended.
func NotObtained(op, name string, ctx context.Context) error {
	return Op(op, name, "", ErrNotObtained, ctx.Err())
}

// ClosedOp is the error of a call that met a closed Client.
func ClosedOp(op, name string) error { return Op(op, name, "", ErrClosed) }

// Codes the scripts raise with redis.error_reply("DLOCK_<CODE> text"), and
// the server's own WRONGTYPE. classify is the one place that reads them.
const (
	codeUpgrade   = "DLOCK_UPGRADE"  // rw_try_write: the owner reads
	codeTooMany   = "DLOCK_TOOMANY"  // sem_permits: the total would rise above MaxPermits
	codeNegative  = "DLOCK_NEGATIVE" // sem_permits: the total would drop below 0
	codeKind      = "DLOCK_KIND"     // lib.lua: a key of another kind: "<key> <what it holds>"
	codeWrongType = "WRONGTYPE"      // a key of another type
	codeNoScript  = "NOSCRIPT"       // the server's script cache lacks the script
)

// Classify splits an error from Redis into its code (the first word of the
// reply) and its text, without the "script: <sha>, on @user_script:N"
// trailer Redis adds to errors raised inside a script. Transport errors have
// no code.
func Classify(err error) (code, text string) {
	if err == nil {
		return "", ""
	}
	var re redis.Error
	if !errors.As(err, &re) {
		return "", err.Error()
	}
	msg := re.Error()
	if i := strings.Index(msg, " script: "); i >= 0 {
		msg = msg[:i]
	}
	code, text, _ = strings.Cut(msg, " ")
	if code == "ERR" && strings.Contains(text, codeWrongType+" ") {
		// miniredis wraps an error raised inside a script in an ERR reply.
		code = codeWrongType
	}
	return code, text
}

// IsNoScript reports whether err says the server lacks a script.
func IsNoScript(err error) bool {
	code, _ := Classify(err)
	return code == codeNoScript
}

// isRedisError reports whether err is a reply from Redis, as opposed to a
// transport failure after which a command's outcome is unknown.
func IsReply(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}

// OutcomeUnknown reports whether a call that failed with err may have run
// on the server: not when Redis answered with an error, nor when the
// request was never sent (no connection could be dialled or taken from the
// pool). Then there is nothing to give back or clean up, which would only
// meet the same unreachable server again.
func OutcomeUnknown(err error) bool {
	if err == nil || IsReply(err) {
		return false
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "dial" {
		return false
	}
	return !errors.Is(err, redis.ErrPoolTimeout) && !errors.Is(err, redis.ErrPoolExhausted) && !errors.Is(err, redis.ErrClosed)
}

// redisErr turns an error from Redis, met by op on the primitive called name
// of the given kind, whose main key is key, into dlock's error for it.
func FromRedis(op, name, kind, key string, err error) error {
	code, text := Classify(err)
	switch code {
	case codeUpgrade:
		return Op(op, name, "", ErrUpgrade)
	case codeTooMany, codeNegative:
		return Op(op, name, text, ErrInvalid)
	case codeKind:
		bad, found, _ := strings.Cut(text, " ")
		detail := fmt.Sprintf("key %q holds %s, not a lock of this kind (%s)", bad, found, kind)
		return &Call{op: op, name: name, detail: detail, errs: []error{ErrInvalid, err}, shown: []error{}}
	case codeWrongType:
		detail := fmt.Sprintf("key %q holds another type, not a lock of this kind (%s)", key, kind)
		return &Call{op: op, name: name, detail: detail, errs: []error{ErrInvalid, err}, shown: []error{}}
	case "":
		if IsUnavailable(err) {
			return Op(op, name, "", ErrUnavailable, err)
		}
		return Op(op, name, "", err)
	case "LOADING", "BUSY", "MASTERDOWN", "CLUSTERDOWN", "READONLY":
		return &Call{op: op, name: name, detail: code + " " + text, errs: []error{ErrUnavailable, err}, shown: []error{ErrUnavailable}}
	}
	return &Call{op: op, name: name, detail: code + " " + text, errs: []error{err}, shown: []error{}}
}

// unavailable reports whether err, not a reply from Redis, says that Redis
// could not be reached: a network error, a connection closed under the
// call, go-redis's client closed or its pool out of connections.
func IsUnavailable(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, redis.ErrClosed) || errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrPoolExhausted)
}

// waitErr maps errors of the wait machinery to dlock's sentinels.
func FromWait(op, name string, err error) error {
	if errors.Is(err, ErrClosed) || errors.Is(err, pubsub.ErrClosed) {
		return ClosedOp(op, name)
	}
	return &Call{op: op, name: name, detail: "subscribe: " + err.Error(), errs: []error{err}, shown: []error{}}
}
