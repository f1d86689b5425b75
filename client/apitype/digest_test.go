package apitype

import (
	"bytes"
	"crypto/sha256"
	"testing"
)

func TestDigestRoundTrip(t *testing.T) {
	sum := sha256.Sum256([]byte("hello"))
	field := FormatDigest(sum[:])
	for _, f := range []string{field, "sha-512=:AAAA:, " + field, " SHA-256" + field[len("sha-256"):]} {
		got, err := ParseDigest(f)
		if err != nil || !bytes.Equal(got, sum[:]) {
			t.Errorf("ParseDigest(%q) = %x, %v; want %x", f, got, err, sum)
		}
	}
	if got, err := ParseDigest(""); got != nil || err != nil {
		t.Errorf("ParseDigest(\"\") = %x, %v; want nothing", got, err)
	}
}

func TestParseDigestRejects(t *testing.T) {
	for f, want := range map[string]string{
		"sha-256=abc":          "digest: sha-256 must be a byte sequence (:base64:)",
		"sha-256=:AAAA:":       "digest: sha-256 must be 32 bytes of base64",
		"sha-256=:!!!!:":       "digest: sha-256 must be 32 bytes of base64",
		"sha-512=:AAAA:":       "digest: only sha-256 is supported",
		"no dictionary at all": "digest: only sha-256 is supported",
	} {
		if _, err := ParseDigest(f); err == nil || err.Error() != want {
			t.Errorf("ParseDigest(%q) = %v; want %q", f, err, want)
		}
	}
}
