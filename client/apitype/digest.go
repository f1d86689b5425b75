package apitype

import (
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strings"
)

// FormatDigest is the RFC 9530 Content-Digest or Repr-Digest value of a sha-256 sum.
func FormatDigest(sum []byte) string {
	return "sha-256=:" + base64.StdEncoding.EncodeToString(sum) + ":"
}

// ParseDigest returns the sha-256 member of an RFC 9530 dictionary ("sha-256=:base64:,
// sha-512=:…:"), nil for an empty field. Other algorithms are ignored; a malformed sha-256,
// or none at all, is an error.
func ParseDigest(field string) ([]byte, error) {
	if field == "" {
		return nil, nil
	}
	for _, member := range strings.Split(field, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(member), "=")
		if !ok || !strings.EqualFold(k, "sha-256") {
			continue
		}
		if len(v) < 2 || v[0] != ':' || v[len(v)-1] != ':' {
			return nil, errors.New("digest: sha-256 must be a byte sequence (:base64:)")
		}
		sum, err := base64.StdEncoding.DecodeString(v[1 : len(v)-1])
		if err != nil || len(sum) != sha256.Size {
			return nil, errors.New("digest: sha-256 must be 32 bytes of base64")
		}
		return sum, nil
	}
	return nil, errors.New("digest: only sha-256 is supported")
}
