package dlock

import (
	"context"
	"crypto/rand"

	"github.com/dlock-go/dlock/internal/engine"
	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/wire"
)

type ownerKey struct{}

// WithOwner returns a copy of ctx that names the owner of the reentrant holds
// (ReentrantMutex, and RWMutex) taken with it. Calls that pass the same owner
// re-enter each other's holds, even through different handles of the same
// lock on the same Client; calls with different owners exclude each other.
//
// Owners are scoped to a Client: the same owner string on two Clients names
// two different owners. An empty owner makes lock calls fail with ErrInvalid.
// Without an owner in the context, calls fail with ErrInvalid, unless the
// handle was made WithHandleOwner: then the handle itself is the owner.
func WithOwner(ctx context.Context, owner string) context.Context {
	return context.WithValue(ctx, ownerKey{}, owner)
}

// WithNewOwner returns a copy of ctx with a fresh random owner, so that
// nested calls passing the context along re-enter while concurrent requests
// exclude each other. Call it where a unit of work starts, once per request
// or job or goroutine that must exclude the others: everything that shares
// the returned context is one owner, and re-enters rather than waits. Four
// goroutines given one such context all hold the lock at once, as one
// goroutine re-entering would.
func WithNewOwner(ctx context.Context) context.Context {
	return WithOwner(ctx, rand.Text())
}

// OwnerFrom returns the owner put in ctx by WithOwner or WithNewOwner.
func OwnerFrom(ctx context.Context) (owner string, ok bool) {
	if ctx == nil {
		return "", false
	}
	owner, ok = ctx.Value(ownerKey{}).(string)
	return owner, ok
}

// ownerID is the owner ID a counted hold is taken under: the Client's ID and
// the owner in ctx, or self (the handle's own ID, for a handle made
// WithHandleOwner; else "") when ctx names none.
func ownerID(c *engine.Core, ctx context.Context, self string) (string, error) {
	o, ok := OwnerFrom(ctx)
	if !ok {
		if self == "" {
			return "", errs.Invalidf("no owner in the context (see WithOwner and WithNewOwner), and the handle was not made WithHandleOwner")
		}
		return self, nil
	}
	if o == "" {
		return "", errs.Invalidf("empty owner in context")
	}
	return wire.OwnerID(c.ID, o), nil
}

// handleOwnerID is the owner ID of a handle made WithHandleOwner, or "".
func handleOwnerID(c *Client, lc lockConfig) string {
	if !lc.handleOwner {
		return ""
	}
	return wire.HandleOwnerID(c.core.ID)
}
