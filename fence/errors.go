package fence

import (
	"errors"
	"fmt"
	"strconv"
)

// Sentinel errors. Test for them with errors.Is: the guards wrap them with
// the resource and the tokens involved.
var (
	// ErrStale means a write carried a token lower than one already admitted
	// for its resource: the writer's lock ended and someone has held it since.
	// Nothing was written. The error is a *StaleError.
	ErrStale = errors.New("fence: stale token")

	// ErrInvalid means bad input: token 0, an empty resource or key, or a
	// guard set up with a bad option. Nothing was written.
	ErrInvalid = errors.New("fence: invalid argument")
)

// StaleError is the error of a refused write. It matches ErrStale.
type StaleError struct {
	Resource string // the resource (the Redis key, the row, the name)
	Token    uint64 // the token the write carried
	Admitted uint64 // the highest token already admitted, greater than Token
}

func (e *StaleError) Error() string {
	return "fence: stale token: " + strconv.Quote(e.Resource) + ": token " +
		strconv.FormatUint(e.Token, 10) + " < admitted " + strconv.FormatUint(e.Admitted, 10)
}

func (e *StaleError) Unwrap() error { return ErrStale }

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// checkArgs rejects an empty resource name and token 0, which no lock
// issues.
func checkArgs(resource string, token uint64) error {
	switch {
	case resource == "":
		return invalidf("empty resource name")
	case token == 0:
		return invalidf("token 0 for %q", resource)
	}
	return nil
}

// admit is the fencing rule, in one place: a write with token may go ahead
// when no higher token has been admitted; equal tokens pass, so one holder
// can write many times.
func admit(resource string, token, admitted uint64) error {
	if token < admitted {
		return &StaleError{Resource: resource, Token: token, Admitted: admitted}
	}
	return nil
}
