package lease

import (
	"crypto/rand"
	"encoding/base32"
	"strings"
)

// idEncoding spells 16 random bytes as 26 lowercase base32 characters.
var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

const idLen = 1 + 26

// newID returns "l" followed by 26 random base32 characters (128 bits).
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return "l" + idEncoding.EncodeToString(b[:])
}

// validID reports whether s has the shape newID produces. IDs become path elements, so
// anything read back from disk is checked with it.
func validID(s string) bool {
	if len(s) != idLen || s[0] != 'l' {
		return false
	}
	return strings.Trim(s[1:], "abcdefghijklmnopqrstuvwxyz234567") == ""
}
