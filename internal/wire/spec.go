package wire

// Spec tells internal/scripts/renew.lua what proves that a lease is still
// held, and the watchdog which keys to send with it: one kind letter
// followed by an ID.
type Spec struct {
	Kind byte
	ID   string
}

// Lease kinds. See internal/scripts/renew.lua for what each one checks.
const (
	// SpecHolder: a primitive's main key (a hash) whose field 'o', the
	// holder, is the ID (a hold of an exclusive lock).
	SpecHolder byte = 'o'
	// SpecField: a hash key holding the ID as a field (an RWMutex writer).
	SpecField byte = 'h'
	// SpecMember: a zset of leases scored by expiry in which the ID is a
	// live member (a permit).
	SpecMember byte = 'z'
	// SpecMemberWith: as SpecMember, plus a companion key that must live as
	// long as the zset (a read hold and its counts; a queue place and the
	// queue).
	SpecMemberWith byte = 'R'
	// SpecMemberWith2: as SpecMemberWith, with two companion keys (a permit:
	// a Semaphore's main key and counts; a Semaphore waiter's place: its
	// queue and main key; an RWMutex read hold: its read counts and main
	// key).
	SpecMemberWith2 byte = 'P'
)

func (s Spec) String() string { return string(s.Kind) + s.ID }

// Keys returns how many keys a lease of this kind sends to the renewal
// script.
func (s Spec) Keys() int {
	switch s.Kind {
	case SpecMemberWith:
		return 2
	case SpecMemberWith2:
		return 3
	}
	return 1
}
