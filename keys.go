package dlock

import "strings"

// Every key of a primitive named n under prefix p starts with p{n}, so that all
// of them hash to one Redis Cluster slot. The lock itself is p{n}; auxiliary
// keys and channels add a suffix.
func lockKey(prefix, name string) string { return prefix + "{" + name + "}" }

func channelOf(key string) string { return key + ":ch" }

func checkName(name string) error {
	switch {
	case name == "":
		return invalidf("empty name")
	case len(name) > MaxNameLength:
		return invalidf("name of %d bytes, longer than the %d bytes a name may have (dlock.MaxNameLength)", len(name), MaxNameLength)
	case strings.HasPrefix(name, "}"):
		// p{}... would make the hash tag empty, scattering a lock's keys
		// over several cluster slots.
		return invalidf("name %q starts with '}'", name)
	}
	return nil
}

// slot is the Redis Cluster hash slot of key: CRC16 (XMODEM) of its hash tag,
// or of the whole key when it has none, modulo 16384.
func slot(key string) uint16 {
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
