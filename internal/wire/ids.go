package wire

import (
	"crypto/rand"
	"encoding/base32"
	"fmt"
	"os"
	"strings"
	"unicode/utf8"

	"github.com/dlock-go/dlock/internal/errs"
)

// IDs. Every ID dlock writes to Redis for a hold or a waiter starts with its
// Client's ID and a dot, so that a script, a release message or an
// inspection can tell which Client it belongs to. A Client's ID is its name,
// escaped, a '~', and a random part:
//
//	web-1%2Eprod:4242~MZXW6YTBOI...
//
// The escape keeps out of the name the characters that the scripts and
// release messages use as separators: '.' (after the Client ID), ',' and
// '|' (release messages), '~' (before the random part), whitespace, control
// characters and '%' itself, each written as %XX. Owners named with
// WithOwner are escaped the same way.

// MaxClientName is the longest Client name WithClientName accepts, in bytes.
const MaxClientName = 128

// DefaultClientName is the name a Client gets without WithClientName: the
// host name and the process ID, "host:pid".
func DefaultClientName() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return fmt.Sprintf("%s:%d", host, os.Getpid())
}

func CheckClientName(name string) error {
	switch {
	case name == "":
		return errs.Invalidf("empty client name")
	case len(name) > MaxClientName:
		return errs.Invalidf("client name longer than %d bytes", MaxClientName)
	case !utf8.ValidString(name):
		return errs.Invalidf("client name %q is not UTF-8", name)
	}
	return nil
}

// NewClientID returns a fresh ID for a Client called name.
func NewClientID(name string) string {
	return EscapeID(name) + "~" + rand.Text()
}

// EscapeID writes s with the characters IDs reserve as %XX.
func EscapeID(s string) string {
	if !strings.ContainsFunc(s, reservedInID) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < utf8.RuneSelf && reservedInID(rune(c)) {
			fmt.Fprintf(&b, "%%%02X", c)
		} else {
			b.WriteByte(c)
		}
	}
	return b.String()
}

func reservedInID(r rune) bool {
	switch r {
	case '.', ',', '|', '~', '%', ' ', 0x7f:
		return true
	}
	return r < ' '
}

// UnescapeID undoes EscapeID; text it did not write comes back as it is.
func UnescapeID(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]) {
			b.WriteByte(unhex(s[i+1])<<4 | unhex(s[i+2]))
			i += 2
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isHex(c byte) bool { return '0' <= c && c <= '9' || 'A' <= c && c <= 'F' || 'a' <= c && c <= 'f' }

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}

// HoldID returns a fresh ID for one acquisition by the Client clientID: its
// ID, a dot, and 128 random bits spelled as rand.Text spells them (a
// Mutex's and a ReentrantMutex's grant).
func HoldID(clientID string) string {
	var random [16]byte
	_, _ = rand.Read(random[:]) // never fails (crypto/rand)
	b := make([]byte, 0, len(clientID)+1+holdIDEncoding.EncodedLen(len(random)))
	b = append(b, clientID...)
	b = append(b, '.')
	return string(holdIDEncoding.AppendEncode(b, random[:]))
}

var holdIDEncoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// OwnerID returns the ID of the counted holds of owner (named with
// WithOwner) on the Client clientID.
func OwnerID(clientID, owner string) string { return clientID + ".o." + EscapeID(owner) }

// HandleOwnerID returns a fresh owner ID for a handle that is its own owner
// (WithHandleOwner).
func HandleOwnerID(clientID string) string { return clientID + ".h." + rand.Text() }

// PermitID returns a fresh ID for one semaphore acquisition. Its ".g."
// says that its Client takes permits a release grants it (sem_common.lua,
// grant_servable); earlier versions' ".p." IDs are named and try again.
func PermitID(clientID string) string { return clientID + ".g." + rand.Text() }

// ClientOf returns the ID of the Client a holder or waiter ID belongs to:
// every such ID starts with it and a dot.
func ClientOf(id string) string {
	c, _, _ := strings.Cut(id, ".")
	return c
}

// ClientNameOf returns the name of the Client a holder or waiter ID belongs
// to, as WithClientName set it ("" for an ID that has none, such as one
// written by a dlock version before names).
func ClientNameOf(id string) string {
	name, _, ok := strings.Cut(ClientOf(id), "~")
	if !ok {
		return ""
	}
	return UnescapeID(name)
}
