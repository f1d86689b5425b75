package lease

import (
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Lease token claims and key derivation constants.
const (
	TokenIssuer   = "sidecar"
	TokenAudience = "sidecar-lease"
	tokenKeyInfo  = "sidecar lease token v1"
	saltFileName  = "token.salt"
	saltLen       = 32
)

// Tokens issues and verifies lease tokens: HS256 JWTs whose subject is a lease id. Keys are
// derived from the shared secrets and a salt kept in the state dir, so tokens survive a
// restart, and rotating the shared secret away revokes them. Safe for concurrent use.
type Tokens struct {
	keys   [][]byte               // keys[0] signs
	verify jwt.VerificationKeySet // all keys, current first: the parser stops at the first match
	now    func() time.Time
}

// NewTokens derives one key per secret: secrets[0] is the current shared token,
// secrets[1:] previous ones still accepted during a rotation. The salt is read from
// stateDir/token.salt, or created there once (32 random bytes, 0600, atomically).
func NewTokens(stateDir string, secrets ...[]byte) (*Tokens, error) {
	if len(secrets) == 0 || len(secrets[0]) == 0 {
		return nil, errors.New("lease: tokens need a non-empty current secret")
	}
	salt, err := loadSalt(stateDir)
	if err != nil {
		return nil, err
	}
	t := &Tokens{now: time.Now}
	for i, s := range secrets {
		if len(s) == 0 {
			continue // an unset previous secret
		}
		k, err := hkdf.Key(sha256.New, s, salt, tokenKeyInfo, sha256.Size)
		if err != nil {
			return nil, fmt.Errorf("lease: derive token key %d: %w", i, err)
		}
		t.keys = append(t.keys, k)
		t.verify.Keys = append(t.verify.Keys, k)
	}
	return t, nil
}

// WithClock returns a copy of t that reads the time from now (for iat, nbf and expiry).
// The daemon shares one clock between its Manager and its Tokens.
func (t *Tokens) WithClock(now func() time.Time) *Tokens {
	c := *t
	c.now = now
	return &c
}

// Issue returns a token for l, valid until l.ExpiresAt, signed with the current key.
func (t *Tokens) Issue(l Lease) (string, error) {
	if !validID(l.ID) || l.ExpiresAt.IsZero() {
		return "", fmt.Errorf("%w: cannot issue a token for lease %q without an expiry", ErrInvalid, l.ID)
	}
	var jti [16]byte
	_, _ = rand.Read(jti[:])
	now := t.now()
	claims := jwt.RegisteredClaims{
		Issuer:    TokenIssuer,
		Subject:   l.ID,
		Audience:  jwt.ClaimStrings{TokenAudience},
		ExpiresAt: jwt.NewNumericDate(l.ExpiresAt),
		NotBefore: jwt.NewNumericDate(now),
		IssuedAt:  jwt.NewNumericDate(now),
		ID:        base64.RawURLEncoding.EncodeToString(jti[:]),
	}
	return jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString(t.keys[0])
}

// Verify checks a token's signature (current key first, then previous ones), algorithm,
// issuer, audience, expiry and issue time, and returns the lease id it grants. Any failure
// is ErrTokenInvalid wrapping the cause. The caller still checks that the lease is active.
// Decoding is strict: the unused low bits of a segment's last base64url character must be
// zero, so a token has exactly one spelling (lenient decoding let four strings verify).
func (t *Tokens) Verify(token string) (leaseID string, err error) {
	leaseID, _, err = t.VerifyExpiry(token)
	return leaseID, err
}

// VerifyExpiry is Verify that also returns the token's expiry, so the daemon can tell a
// token that its lease has outlived (the owner renewed) and hand out a fresh one.
func (t *Tokens) VerifyExpiry(token string) (leaseID string, expires time.Time, err error) {
	var claims jwt.RegisteredClaims
	_, err = jwt.ParseWithClaims(token, &claims,
		func(*jwt.Token) (any, error) { return t.verify, nil },
		jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}),
		jwt.WithExpirationRequired(),
		jwt.WithIssuer(TokenIssuer),
		jwt.WithAudience(TokenAudience),
		jwt.WithIssuedAt(),
		jwt.WithTimeFunc(t.now),
		jwt.WithStrictDecoding(),
	)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("%w: %w", ErrTokenInvalid, err)
	}
	if !validID(claims.Subject) {
		return "", time.Time{}, fmt.Errorf("%w: subject is not a lease id", ErrTokenInvalid)
	}
	return claims.Subject, claims.ExpiresAt.Time, nil
}

// loadSalt reads the salt, creating it on first use. Creation never replaces a salt another
// process made first: that would silently revoke every token issued with it.
func loadSalt(stateDir string) ([]byte, error) {
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("lease: state dir: %w", err)
	}
	path := filepath.Join(stateDir, saltFileName)
	salt, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		fresh := make([]byte, saltLen)
		_, _ = rand.Read(fresh)
		if err := createFileAtomic(path, fresh, 0o600); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("lease: create token salt: %w", err)
		}
		salt, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, fmt.Errorf("lease: read token salt: %w", err)
	}
	if len(salt) != saltLen {
		return nil, fmt.Errorf("lease: token salt %s holds %d bytes, want %d", path, len(salt), saltLen)
	}
	return salt, nil
}
