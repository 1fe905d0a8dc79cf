package wire

import (
	"strings"

	"github.com/dlock-go/dlock/internal/errs"
)

// MaxNameLength is the longest name, in bytes, a primitive may have (see
// dlock.MaxNameLength).
const MaxNameLength = 1024

// Every key of a primitive named n under prefix p starts with p{n}, so that all
// of them hash to one Redis Cluster slot. The lock itself is p{n}; auxiliary
// keys and channels add a suffix.
func LockKey(prefix, name string) string { return prefix + "{" + name + "}" }

func ChannelOf(key string) string { return key + ChannelSuffix }

// ChannelSuffix makes a lock's channel of its main key.
const ChannelSuffix = ":ch"

func CheckName(name string) error {
	switch {
	case name == "":
		return errs.Invalidf("empty name")
	case len(name) > MaxNameLength:
		return errs.Invalidf("name of %d bytes, longer than the %d bytes a name may have (dlock.MaxNameLength)", len(name), MaxNameLength)
	case strings.HasPrefix(name, "}"):
		// p{}... would make the hash tag empty, scattering a lock's keys
		// over several cluster slots.
		return errs.Invalidf("name %q starts with '}'", name)
	}
	return nil
}

// Slot is the Redis Cluster hash slot of key: CRC16 (XMODEM) of its hash tag,
// or of the whole key when it has none, modulo 16384.
func Slot(key string) uint16 {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			key = key[s+1 : s+1+e]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % 16384
}
