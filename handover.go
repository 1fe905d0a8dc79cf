package dlock

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/dlock-go/dlock/internal/engine"
	"github.com/dlock-go/dlock/internal/errs"
	"github.com/dlock-go/dlock/internal/scripts"
	"github.com/dlock-go/dlock/internal/telemetry"
	"github.com/dlock-go/dlock/internal/wire"
)

// HoldRef names one hold of a lock so that another Client, in another
// process, can release or extend it: what redsync's WithValue and
// redislock's Token give. Get one with Mutex.HandOver, send its text form
// (String, or MarshalText) to wherever the work continues, read it back with
// ParseHoldRef (or UnmarshalText), and end the hold there with
// Client.ReleaseRef or prolong it with Client.ExtendRef.
//
// A HoldRef carries the hold's ID, the random value stored in Redis that
// Unlock checks, which no other hold ever has. A stale HoldRef (its hold
// was released, or expired and the lock was taken again) therefore never
// touches a newer hold: ReleaseRef and ExtendRef then return ErrNotHeld and
// change nothing. The ID is what lets its bearer release the lock: treat
// the text like a credential.
//
// A HoldRef may also be built from what Status reports (Holder.ID and
// Status.Token): ReleaseRef then ends that one hold and no later one, a
// safer tool for operators than ForceUnlock. A holder that still keeps the
// hold learns at its next renewal that it was lost. The holds that a Mutex
// WithCohort hands on locally share the ID of the grant in Redis they came
// from: a HoldRef built from Status ends whichever of them holds the lock
// then. (HandOver itself ends the handle's cohort: nothing is handed on
// locally from a hold that was handed over.)
type HoldRef struct {
	Name string // the lock's name, without the key prefix
	Kind string // the primitive: KindMutex
	ID   string // the hold's ID, as Status lists it in Holder.ID
	// Token is the hold's fencing token, for the bearer to send with its
	// writes. ReleaseRef and ExtendRef do not check it: the ID alone names
	// the hold.
	Token uint64
}

// holdRefVersion starts the text form of a HoldRef.
const holdRefVersion = "dlock1"

// String returns the text form of r: "dlock1 <kind> <token> <id> <name>",
// which ParseHoldRef reads back. Treat it as opaque.
func (r HoldRef) String() string {
	return holdRefVersion + " " + r.Kind + " " + strconv.FormatUint(r.Token, 10) + " " + r.ID + " " + r.Name
}

// MarshalText returns the text form of r (see String); an invalid r is an
// error wrapping ErrInvalid.
func (r HoldRef) MarshalText() ([]byte, error) {
	if err := r.check(); err != nil {
		return nil, err
	}
	return []byte(r.String()), nil
}

// UnmarshalText reads the text form of a HoldRef (see ParseHoldRef).
func (r *HoldRef) UnmarshalText(text []byte) error {
	ref, err := ParseHoldRef(string(text))
	if err != nil {
		return err
	}
	*r = ref
	return nil
}

// ParseHoldRef reads the text form of a HoldRef, as String writes it.
// Anything else is an error wrapping ErrInvalid.
func ParseHoldRef(s string) (HoldRef, error) {
	parts := strings.SplitN(s, " ", 5)
	if len(parts) != 5 || parts[0] != holdRefVersion {
		return HoldRef{}, errs.Invalidf("malformed hold reference %q", s)
	}
	token, err := strconv.ParseUint(parts[2], 10, 64)
	if err != nil {
		return HoldRef{}, errs.Invalidf("malformed hold reference %q: bad token", s)
	}
	r := HoldRef{Kind: parts[1], Token: token, ID: parts[3], Name: parts[4]}
	if err := r.check(); err != nil {
		return HoldRef{}, err
	}
	return r, nil
}

// check reports what makes r unusable, as an error wrapping ErrInvalid.
func (r HoldRef) check() error {
	switch {
	case wire.CheckName(r.Name) != nil:
		return errs.Invalidf("hold reference with bad name %q", r.Name)
	case r.Kind != KindMutex:
		return errs.Invalidf("hold reference of kind %q: only a Mutex (%q) hold can be handed over", r.Kind, KindMutex)
	case r.Token == 0:
		return errs.Invalidf("hold reference with no fencing token")
	case !validHoldID(r.ID):
		return errs.Invalidf("hold reference with malformed ID %q", r.ID)
	}
	return nil
}

// validHoldID reports whether id looks like an ID a Mutex holds under: a
// Client's ID, a dot and a random part, with no separator or control
// characters.
func validHoldID(id string) bool {
	client, random, ok := strings.Cut(id, ".")
	if !ok || client == "" || random == "" {
		return false
	}
	return !strings.ContainsFunc(id, func(r rune) bool { return r <= ' ' || r == 0x7f || r == ',' || r == '|' })
}

// HandOver gives the handle's current hold away: it returns a HoldRef for
// it, and the handle no longer holds it. It sends nothing to Redis.
//
// The hold itself goes on in Redis, but nothing renews it any more: the
// watchdog stops, so it ends when its lease runs out (what the last grant
// or renewal gave it: up to the watchdog timeout, or what is left of a
// WithLease lease) unless the bearer of the reference calls
// Client.ExtendRef in time, or ends it sooner with Client.ReleaseRef. The
// bearer cannot know how much of that lease is left when the reference
// reaches it: it should call ExtendRef as soon as it has the reference,
// and act on the hold only once ExtendRef has succeeded, counting its
// lease from when it sent that call (as the watchdog does). The
// handle's hold contexts are cancelled (the cause does not match ErrLost:
// nothing was lost), its Lost channel never fires, Token returns 0, and
// its Unlock and Extend return ErrNotHeld, as after Unlock; the handle may
// Lock again. So exactly one party is responsible for the hold at any time.
//
// It returns an error matching ErrNotHeld when the handle holds nothing,
// and ErrLost when the hold was already lost. A Mutex made by a Redlock
// cannot hand its holds over: that is ErrInvalid. A renewal in flight is
// waited for (at most the hold's lease left), so that none lands after the
// hand-over.
func (m *Mutex) HandOver() (HoldRef, error) {
	const op = "handover"
	if err := m.h.Usable(context.Background()); err != nil {
		return HoldRef{}, err
	}
	if !m.lk.HandsOver() {
		// ReleaseRef and ExtendRef act on one Redis, not on a quorum.
		return HoldRef{}, errs.Op(op, m.h.Name, "a Redlock hold cannot be handed over", ErrInvalid)
	}
	l := m.slot.Get()
	if l == nil {
		return HoldRef{}, errs.Op(op, m.h.Name, "", ErrNotHeld)
	}
	w := m.h.C.WD
	if err := w.BeginExtend(context.Background(), &l.Lease); err != nil {
		return HoldRef{}, errs.Op(op, m.h.Name, "", err)
	}
	if !m.slot.TakeIf(l) {
		return HoldRef{}, errs.Op(op, m.h.Name, "", ErrNotHeld) // an Unlock came first
	}
	if !w.HandOver(&l.Lease) {
		return HoldRef{}, errs.Op(op, m.h.Name, "", ErrLost)
	}
	m.h.C.DropServed(l) // the places its cohort served: the hold's release will not drop them
	return HoldRef{Name: m.h.Name, Kind: KindMutex, ID: l.Spec.ID, Token: l.Token}, nil
}

// ReleaseRef releases the hold ref names, as its holder's Unlock would: if
// callers are queued, the lock passes straight to the first of them, and
// they are woken (on this Client directly, elsewhere through the release
// message). One round trip. The Client must use the key prefix of the
// Client that took the hold.
//
// It returns an error matching ErrNotHeld when that hold no longer holds
// the lock (it was released, or it expired, whoever holds the lock now):
// then nothing changes. An invalid ref is ErrInvalid. The request is sent
// even when ctx has ended (see Mutex.Unlock); when it fails in transit, the
// outcome is unknown and the hold ends by its lease at the latest.
func (c *Client) ReleaseRef(ctx context.Context, ref HoldRef) (err error) {
	const op = "release"
	if err := ref.check(); err != nil {
		return errs.Op(op, ref.Name, "", err)
	}
	h := c.core.NewHandle(telemetry.KindMutex, ref.Name, 0, 0, nil, engine.ExclKeys...)
	ctx, sp, err := h.Begin(ctx, "dlock.Client.ReleaseRef")
	defer func() { sp.EndRelease(err) }()
	if err != nil {
		return err
	}
	remaining, err := engine.NewExcl(h, false).Unlock(engine.Detach(ctx), ref.ID)
	switch {
	case err != nil:
		return h.Fail(op, err)
	case remaining < 0:
		return errs.Op(op, ref.Name, "", ErrNotHeld)
	}
	return nil
}

// ExtendRef makes the hold ref names end lease from now (from when Redis
// runs the request), sooner or later than before, in one round trip, as
// the holder's Extend would. The fencing token stays the same.
//
// It returns an error matching ErrNotHeld when that hold no longer holds
// the lock: then nothing changes, and a newer hold is never extended. A
// lease outside [MinLease, MaxLease], or an invalid ref, is ErrInvalid.
func (c *Client) ExtendRef(ctx context.Context, ref HoldRef, lease time.Duration) (err error) {
	const op = "extend"
	if err := ref.check(); err != nil {
		return errs.Op(op, ref.Name, "", err)
	}
	h := c.core.NewHandle(telemetry.KindMutex, ref.Name, 0, 0, nil, engine.ExclKeys...)
	ctx, sp, err := h.Begin(ctx, "dlock.Client.ExtendRef")
	defer func() { sp.EndOther(err) }()
	switch {
	case err != nil:
		return err
	case outOfBounds("lease", lease) != "":
		return errs.Op(op, ref.Name, outOfBounds("lease", lease), ErrInvalid)
	}
	spec := wire.Spec{Kind: wire.SpecHolder, ID: ref.ID}
	res, err := c.core.Script(ctx, scripts.Renew, []string{h.Key}, wire.Millis(lease), spec.String()).Int64Slice()
	if err == nil && len(res) != 1 {
		err = fmt.Errorf("unexpected reply %v", res)
	}
	switch {
	case err != nil:
		return h.Fail(op, err)
	case res[0] != 1:
		return errs.Op(op, ref.Name, "", ErrNotHeld)
	}
	return nil
}
