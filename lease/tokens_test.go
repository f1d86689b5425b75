package lease

import (
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

var (
	secretA = []byte("secret-A-0123456789abcdef0123456789")
	secretB = []byte("secret-B-0123456789abcdef0123456789")
	secretC = []byte("secret-C-0123456789abcdef0123456789")
)

func newTokens(t *testing.T, dir string, clock *fakeClock, secrets ...[]byte) *Tokens {
	t.Helper()
	tk, err := NewTokens(dir, secrets...)
	if err != nil {
		t.Fatal(err)
	}
	return tk.WithClock(clock.Now)
}

func testLease(clock *fakeClock) Lease {
	return Lease{ID: newID(), SessionID: "s", CreatedAt: clock.Now(), ExpiresAt: clock.Now().Add(time.Hour)}
}

// sign makes a token with arbitrary claims and method, keyed like t's current key.
func sign(t *testing.T, tk *Tokens, method jwt.SigningMethod, claims jwt.Claims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(method, claims).SignedString(tk.keys[0])
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestTokens(t *testing.T) {
	clock := newClock()
	dir := t.TempDir()
	tk := newTokens(t, dir, clock, secretA)
	l := testLease(clock)
	good, err := tk.Issue(l)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(good, string(secretA)) {
		t.Fatal("token holds the secret")
	}
	now := clock.Now()
	claims := func(edit func(*jwt.RegisteredClaims)) jwt.RegisteredClaims {
		c := jwt.RegisteredClaims{
			Issuer: TokenIssuer, Subject: l.ID, Audience: jwt.ClaimStrings{TokenAudience},
			ExpiresAt: jwt.NewNumericDate(now.Add(time.Hour)), IssuedAt: jwt.NewNumericDate(now),
			NotBefore: jwt.NewNumericDate(now),
		}
		edit(&c)
		return c
	}
	parts := strings.Split(good, ".")
	flip := func(s string) string { // change one character of the signature
		b := []byte(s)
		if b[0] == 'A' {
			b[0] = 'B'
		} else {
			b[0] = 'A'
		}
		return string(b)
	}
	otherSub := strings.Replace(good, parts[1], base64.RawURLEncoding.EncodeToString(
		[]byte(`{"iss":"sidecar","sub":"`+newID()+`","aud":["sidecar-lease"],"exp":9999999999,"iat":1}`)), 1)
	noneToken, err := jwt.NewWithClaims(jwt.SigningMethodNone, claims(func(*jwt.RegisteredClaims) {})).
		SignedString(jwt.UnsafeAllowNoneSignatureType)
	if err != nil {
		t.Fatal(err)
	}
	otherKey := newTokens(t, dir, clock, secretB)
	otherSalt := newTokens(t, t.TempDir(), clock, secretA)
	fromOtherKey, _ := otherKey.Issue(l)
	fromOtherSalt, _ := otherSalt.Issue(l)

	for _, tc := range []struct {
		name    string
		token   string
		advance time.Duration
		wantErr error // besides ErrTokenInvalid; nil: valid
	}{
		{"valid", good, 0, nil},
		{"valid until just before expiry", good, time.Hour - time.Second, nil},
		{"expired", good, time.Hour, jwt.ErrTokenExpired},
		{"other secret", fromOtherKey, 0, jwt.ErrTokenSignatureInvalid},
		{"other salt", fromOtherSalt, 0, jwt.ErrTokenSignatureInvalid},
		{"tampered signature", parts[0] + "." + parts[1] + "." + flip(parts[2]), 0, jwt.ErrTokenSignatureInvalid},
		{"tampered subject", otherSub, 0, jwt.ErrTokenSignatureInvalid},
		{"alg none", noneToken, 0, jwt.ErrTokenSignatureInvalid},
		{"alg none, signature stripped", parts[0] + "." + parts[1] + ".", 0, jwt.ErrTokenSignatureInvalid},
		{"HS512 with the right key", sign(t, tk, jwt.SigningMethodHS512, claims(func(*jwt.RegisteredClaims) {})), 0, jwt.ErrTokenSignatureInvalid},
		{"wrong audience", sign(t, tk, jwt.SigningMethodHS256, claims(func(c *jwt.RegisteredClaims) { c.Audience = jwt.ClaimStrings{"other"} })), 0, jwt.ErrTokenInvalidAudience},
		{"no audience", sign(t, tk, jwt.SigningMethodHS256, claims(func(c *jwt.RegisteredClaims) { c.Audience = nil })), 0, jwt.ErrTokenRequiredClaimMissing},
		{"wrong issuer", sign(t, tk, jwt.SigningMethodHS256, claims(func(c *jwt.RegisteredClaims) { c.Issuer = "evil" })), 0, jwt.ErrTokenInvalidIssuer},
		{"no expiry", sign(t, tk, jwt.SigningMethodHS256, claims(func(c *jwt.RegisteredClaims) { c.ExpiresAt = nil })), 0, jwt.ErrTokenRequiredClaimMissing},
		{"issued in the future", sign(t, tk, jwt.SigningMethodHS256, claims(func(c *jwt.RegisteredClaims) { c.IssuedAt = jwt.NewNumericDate(now.Add(time.Hour)) })), 0, jwt.ErrTokenUsedBeforeIssued},
		{"not yet valid", sign(t, tk, jwt.SigningMethodHS256, claims(func(c *jwt.RegisteredClaims) { c.NotBefore = jwt.NewNumericDate(now.Add(time.Hour)) })), 0, jwt.ErrTokenNotValidYet},
		{"subject not a lease id", sign(t, tk, jwt.SigningMethodHS256, claims(func(c *jwt.RegisteredClaims) { c.Subject = "../x" })), 0, ErrTokenInvalid},
		{"garbage", "not.a.token", 0, jwt.ErrTokenMalformed},
		{"empty", "", 0, jwt.ErrTokenMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &fakeClock{now: now.Add(tc.advance)}
			id, err := tk.WithClock(c.Now).Verify(tc.token)
			if tc.wantErr == nil {
				if err != nil || id != l.ID {
					t.Fatalf("Verify = %q, %v; want %q", id, err, l.ID)
				}
				return
			}
			if !errors.Is(err, ErrTokenInvalid) || id != "" {
				t.Fatalf("Verify = %q, %v; want ErrTokenInvalid", id, err)
			}
			if !errors.Is(err, tc.wantErr) {
				t.Errorf("cause = %v, want %v", err, tc.wantErr)
			}
		})
	}
}

func TestTokenClaims(t *testing.T) {
	clock := newClock()
	tk := newTokens(t, t.TempDir(), clock, secretA)
	l := testLease(clock)
	s1, _ := tk.Issue(l)
	s2, _ := tk.Issue(l)
	if s1 == s2 {
		t.Error("two tokens for one lease are identical: jti is not random")
	}
	var c jwt.RegisteredClaims
	tok, _, err := jwt.NewParser().ParseUnverified(s1, &c)
	if err != nil {
		t.Fatal(err)
	}
	if tok.Header["alg"] != "HS256" || c.Issuer != "sidecar" || c.Subject != l.ID || len(c.Audience) != 1 ||
		c.Audience[0] != "sidecar-lease" || !c.ExpiresAt.Equal(l.ExpiresAt) || !c.IssuedAt.Equal(clock.Now()) ||
		!c.NotBefore.Equal(clock.Now()) || c.ID == "" {
		t.Errorf("header %v claims %+v", tok.Header, c)
	}
	if _, err := tk.Issue(Lease{ID: "bad"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Issue for a lease without id or expiry: %v, want ErrInvalid", err)
	}
}

func TestTokenRotation(t *testing.T) {
	clock := newClock()
	dir := t.TempDir()
	l := testLease(clock)
	old, _ := newTokens(t, dir, clock, secretA).Issue(l)

	// During the rotation: B signs, A still verifies.
	rotating := newTokens(t, dir, clock, secretB, secretA)
	if id, err := rotating.Verify(old); err != nil || id != l.ID {
		t.Errorf("token of the previous secret during rotation: %q, %v", id, err)
	}
	fresh, _ := rotating.Issue(l)
	if _, err := newTokens(t, dir, clock, secretA).Verify(fresh); !errors.Is(err, ErrTokenInvalid) {
		t.Errorf("new token verified by the old secret alone: signed with the previous key?")
	}
	// An empty previous secret (unset env) is ignored, not a key.
	if _, err := newTokens(t, dir, clock, secretB, nil).Verify(fresh); err != nil {
		t.Errorf("with an empty previous secret: %v", err)
	}

	// After the rotation A is gone, and with it every token it signed.
	done := newTokens(t, dir, clock, secretB, secretC)
	if _, err := done.Verify(old); !errors.Is(err, ErrTokenInvalid) {
		t.Errorf("token of a rotated-away secret: %v, want ErrTokenInvalid", err)
	}
	if _, err := done.Verify(fresh); err != nil {
		t.Errorf("token of the current secret: %v", err)
	}
}

func TestTokenSalt(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	if _, err := NewTokens(dir); err == nil {
		t.Error("NewTokens without a secret succeeded")
	}
	if _, err := NewTokens(dir, nil); err == nil {
		t.Error("NewTokens with an empty current secret succeeded")
	}

	// Racing first starts agree on one salt.
	var wg sync.WaitGroup
	toks := make([]*Tokens, 8)
	for i := range toks {
		wg.Go(func() {
			tk, err := NewTokens(dir, secretA)
			if err != nil {
				t.Error(err)
				return
			}
			toks[i] = tk
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	for _, tk := range toks[1:] {
		if string(tk.keys[0]) != string(toks[0].keys[0]) {
			t.Fatal("concurrent NewTokens derived different keys: the salt was replaced")
		}
	}
	path := filepath.Join(dir, saltFileName)
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Size() != saltLen {
		t.Fatalf("salt file: %v %v", fi, err)
	}
	des, _ := os.ReadDir(dir)
	if len(des) != 1 {
		t.Errorf("state dir holds %d entries, want just the salt", len(des))
	}

	if err := os.WriteFile(path, []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := NewTokens(dir, secretA); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("NewTokens with a damaged salt: %v, want an error naming it", err)
	}
}

// A token with its last character changed is refused, whatever it is changed to: the
// signature's last character carries unused low bits, which lenient base64 ignores.
func TestTokenLastCharacterEdited(t *testing.T) {
	clock := newClock()
	tk := newTokens(t, t.TempDir(), clock, secretA)
	good, err := tk.Issue(testLease(clock))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tk.Verify(good); err != nil {
		t.Fatalf("the issued token: %v", err)
	}
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	last := good[len(good)-1]
	for _, c := range []byte(alphabet) {
		if c == last {
			continue
		}
		edited := good[:len(good)-1] + string(c)
		if id, err := tk.Verify(edited); !errors.Is(err, ErrTokenInvalid) || id != "" {
			t.Errorf("last character %q → %q: Verify = %q, %v; want ErrTokenInvalid", last, c, id, err)
		}
	}
}
