package lease

import (
	"encoding/base64"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// FuzzTokenVerify feeds arbitrary strings to Tokens.Verify. It must never panic, and it
// must accept only what Issue produced: an accepted token is byte for byte an issued one
// (strict decoding leaves no other spelling of its signature), and the lease id it grants
// is that token's.
func FuzzTokenVerify(f *testing.F) {
	clock := newClock()
	tk, err := NewTokens(f.TempDir(), secretA, secretB)
	if err != nil {
		f.Fatal(err)
	}
	tk = tk.WithClock(clock.Now)
	other, err := NewTokens(f.TempDir(), secretC)
	if err != nil {
		f.Fatal(err)
	}
	issued := map[string]string{} // signed part → lease id
	var seeds []string
	for range 3 {
		l := testLease(clock)
		s, err := tk.Issue(l)
		if err != nil {
			f.Fatal(err)
		}
		issued[signedPart(s)] = l.ID
		seeds = append(seeds, s)
	}
	forged, err := other.Issue(testLease(clock)) // right shape, wrong key
	if err != nil {
		f.Fatal(err)
	}
	none, err := jwt.NewWithClaims(jwt.SigningMethodNone, jwt.RegisteredClaims{
		Issuer: TokenIssuer, Subject: newID(), Audience: jwt.ClaimStrings{TokenAudience},
		ExpiresAt: jwt.NewNumericDate(clock.Now().Add(time.Hour)), IssuedAt: jwt.NewNumericDate(clock.Now()),
	}).SignedString(jwt.UnsafeAllowNoneSignatureType)
	if err != nil {
		f.Fatal(err)
	}
	parts := strings.Split(seeds[0], ".")
	const b64url = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	last := strings.IndexByte(b64url, seeds[0][len(seeds[0])-1])
	lowBitFlipped := seeds[0][:len(seeds[0])-1] + string(b64url[last^1]) // lenient base64 ignored it
	seeds = append(seeds, forged, none, "", ".", "..", "a.b.c", parts[0]+"."+parts[1]+".",
		parts[0]+"."+parts[1], strings.ToUpper(seeds[1]), seeds[2]+"=", " "+seeds[2],
		parts[0]+"."+base64.RawURLEncoding.EncodeToString([]byte(`{"sub":"`+newID()+`"}`))+"."+parts[2],
		`{"alg":"HS256"}.{}.`, strings.Repeat("A", 4096), lowBitFlipped)
	for _, s := range seeds {
		f.Add(s)
	}

	f.Fuzz(func(t *testing.T, s string) {
		id, err := tk.Verify(s)
		if err != nil {
			if id != "" {
				t.Fatalf("Verify failed (%v) but granted %q", err, id)
			}
			return
		}
		want, ok := issued[signedPart(s)]
		if !ok {
			t.Fatalf("Verify accepted a token Issue never produced: %q", s)
		}
		if id != want {
			t.Fatalf("Verify granted %q, the token was issued for %q", id, want)
		}
		// Strict decoding: a token has one spelling, the one Issue produced.
		if !slices.Contains(seeds[:3], s) {
			t.Fatalf("accepted a spelling of a token that Issue did not produce: %q", s)
		}
	})
}

// signedPart is header.claims: what the signature covers.
func signedPart(token string) string {
	i := strings.LastIndexByte(token, '.')
	if i < 0 {
		return token
	}
	return token[:i]
}
