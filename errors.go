package dlock

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

// Sentinel errors. Test for them with errors.Is: dlock wraps them with the
// operation and the lock's name.
var (
	// ErrNotObtained means the lock or permit was not acquired: TryLock found
	// it taken, or a blocking call's context ended first. In the second case
	// the error also matches the context's error (context.Canceled or
	// context.DeadlineExceeded).
	ErrNotObtained = errors.New("dlock: not obtained")

	// ErrNotHeld means an Unlock or Release found nothing of the caller's to
	// release. Nothing was changed.
	ErrNotHeld = errors.New("dlock: not held")

	// ErrLost means a hold ended without its holder releasing it: the lease
	// expired, the key was deleted, or renewals failed for longer than the
	// lease. It is the cause of a hold context's cancellation, and Unlock of a
	// lost hold returns it.
	ErrLost = errors.New("dlock: lock lost")

	// ErrUpgrade means an owner holding an RWMutex read lock asked for the
	// write lock, which would wait for itself. Release the read lock first,
	// or take the write lock first and downgrade.
	ErrUpgrade = errors.New("dlock: read lock cannot be upgraded")

	// ErrNotFound means Client.Status or Client.ForceUnlock found no
	// primitive by that name.
	ErrNotFound = errors.New("dlock: not found")

	// ErrNoLeader means Election.Leader found nobody leading.
	ErrNoLeader = errors.New("dlock: no leader")

	// ErrNotReplicated means an acquisition on a Client made with
	// WithSyncReplicas was granted, but fewer replicas than it asks for
	// acknowledged the grant within its timeout (or the WAIT that asks them
	// failed). The grant was given back before the call returned, so the
	// caller holds nothing; the error also matches ErrNotObtained. A blocking
	// call fails with it rather than trying again.
	ErrNotReplicated = errors.New("dlock: not acknowledged by replicas")

	// ErrClosed means the Client was closed.
	ErrClosed = errors.New("dlock: client closed")

	// ErrUnavailable means Redis could not be reached or could not serve
	// the call: a dial, write or read failed or timed out, go-redis's client
	// was closed or its pool had no connection to give, or Redis answered
	// that it cannot serve now (LOADING, BUSY, MASTERDOWN, CLUSTERDOWN,
	// READONLY). The error also matches the error underneath. Whether the
	// call took effect is then unknown; each call says what it does about it
	// (an acquisition gives back whatever it may have been granted, a
	// release leaves the hold to end by its lease).
	//
	// How long a call takes to fail is go-redis's to say, since a request
	// whose outcome dlock must know is not cut short by the caller's ctx:
	// with go-redis's defaults, about 2 s when connections are refused, and
	// up to ReadTimeout (3 s) for each of 1+MaxRetries (4) attempts when
	// packets are dropped. Lower those options on the go-redis client for a
	// quicker answer. A hold's Lost never waits for them: it fires at the
	// hold's deadline whatever is in flight.
	ErrUnavailable = errors.New("dlock: redis unavailable")

	// ErrInvalid means bad input: an empty name, a non-positive lease or
	// timeout, an empty owner, a nil Redis client, or a name whose key holds
	// something other than a primitive of the kind asked for. Nothing was
	// written to Redis.
	ErrInvalid = errors.New("dlock: invalid argument")
)

// callError is the error of one call on a named primitive. It reads
// `dlock: <op> "<name>": <what>: <detail>`, with one "dlock:" prefix however
// many of dlock's sentinels it matches.
type callError struct {
	op, name string
	detail   string  // optional, after the sentinels' texts
	errs     []error // what errors.Is and errors.As see
	shown    []error // what the message shows; errs when nil
}

func (e *callError) Error() string {
	var b strings.Builder
	b.WriteString("dlock: ")
	b.WriteString(e.op)
	b.WriteByte(' ')
	b.WriteString(strconv.Quote(capName(e.name, errorNameBytes)))
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

func (e *callError) Unwrap() []error { return e.errs }

// errorNameBytes is the most of a name an error message quotes.
const errorNameBytes = 128

// capName returns name cut to at most max bytes (at a rune boundary), with
// an ellipsis and the name's length when it was cut.
func capName(name string, max int) string {
	if len(name) <= max {
		return name
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(name[cut]) {
		cut--
	}
	return name[:cut] + "…(" + strconv.Itoa(len(name)) + " bytes)"
}

// opErr returns the error of op on the primitive called name: it matches
// every error in errs, and detail (if any) follows their texts.
func opErr(op, name, detail string, errs ...error) error {
	return &callError{op: op, name: name, detail: detail, errs: errs}
}

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// notObtained is the error of a blocking acquisition whose context ended.
func notObtained(op, name string, ctx context.Context) error {
	return opErr(op, name, "", ErrNotObtained, ctx.Err())
}

// closedErr is the error of a call that met a closed Client.
func closedErr(op, name string) error { return opErr(op, name, "", ErrClosed) }

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

// classify splits an error from Redis into its code (the first word of the
// reply) and its text, without the "script: <sha>, on @user_script:N"
// trailer Redis adds to errors raised inside a script. Transport errors have
// no code.
func classify(err error) (code, text string) {
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

// isNoScript reports whether err says the server lacks a script.
func isNoScript(err error) bool {
	code, _ := classify(err)
	return code == codeNoScript
}

// isRedisError reports whether err is a reply from Redis, as opposed to a
// transport failure after which a command's outcome is unknown.
func isRedisError(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}

// outcomeUnknown reports whether a call that failed with err may have run
// on the server: not when Redis answered with an error, nor when the
// request was never sent (no connection could be dialled or taken from the
// pool). Then there is nothing to give back or clean up, which would only
// meet the same unreachable server again.
func outcomeUnknown(err error) bool {
	if err == nil || isRedisError(err) {
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
func redisErr(op, name, kind, key string, err error) error {
	code, text := classify(err)
	switch code {
	case codeUpgrade:
		return opErr(op, name, "", ErrUpgrade)
	case codeTooMany, codeNegative:
		return opErr(op, name, text, ErrInvalid)
	case codeKind:
		bad, found, _ := strings.Cut(text, " ")
		detail := fmt.Sprintf("key %q holds %s, not a lock of this kind (%s)", bad, found, kind)
		return &callError{op: op, name: name, detail: detail, errs: []error{ErrInvalid, err}, shown: []error{}}
	case codeWrongType:
		detail := fmt.Sprintf("key %q holds another type, not a lock of this kind (%s)", key, kind)
		return &callError{op: op, name: name, detail: detail, errs: []error{ErrInvalid, err}, shown: []error{}}
	case "":
		if unavailable(err) {
			return opErr(op, name, "", ErrUnavailable, err)
		}
		return opErr(op, name, "", err)
	case "LOADING", "BUSY", "MASTERDOWN", "CLUSTERDOWN", "READONLY":
		return &callError{op: op, name: name, detail: code + " " + text, errs: []error{ErrUnavailable, err}, shown: []error{ErrUnavailable}}
	}
	return &callError{op: op, name: name, detail: code + " " + text, errs: []error{err}, shown: []error{}}
}

// unavailable reports whether err, not a reply from Redis, says that Redis
// could not be reached: a network error, a connection closed under the
// call, go-redis's client closed or its pool out of connections.
func unavailable(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, redis.ErrClosed) || errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrPoolExhausted)
}

// waitErr maps errors of the wait machinery to dlock's sentinels.
func waitErr(op, name string, err error) error {
	if errors.Is(err, ErrClosed) || errors.Is(err, pubsub.ErrClosed) {
		return closedErr(op, name)
	}
	return &callError{op: op, name: name, detail: "subscribe: " + err.Error(), errs: []error{err}, shown: []error{}}
}
