package certgen

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func mustCert(t *testing.T, certPEM []byte) *x509.Certificate {
	t.Helper()
	cert, err := parseCertPEM(certPEM)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

func TestCAIssuesVerifiableLeaves(t *testing.T) {
	ca, err := NewCA("test CA", 0)
	if err != nil {
		t.Fatal(err)
	}
	if !ca.Cert.IsCA || !ca.Cert.MaxPathLenZero {
		t.Fatalf("CA: IsCA=%v MaxPathLenZero=%v", ca.Cert.IsCA, ca.Cert.MaxPathLenZero)
	}
	if got := ca.Cert.NotAfter.Sub(ca.Cert.NotBefore); got < DefaultCALifetime {
		t.Errorf("CA lifetime %v, want at least %v", got, DefaultCALifetime)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)

	srvPEM, srvKey, err := ca.IssueServer([]string{"sandbox.internal", "10.0.0.7", "::1"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	srv := mustCert(t, srvPEM)
	for _, host := range []string{"sandbox.internal", "10.0.0.7", "::1"} {
		if _, err := srv.Verify(x509.VerifyOptions{DNSName: host, Roots: roots}); err != nil {
			t.Errorf("server cert for %s: %v", host, err)
		}
	}
	if _, err := srv.Verify(x509.VerifyOptions{DNSName: "other.internal", Roots: roots}); err == nil {
		t.Error("server cert verified for a host it does not name")
	}
	if _, err := srv.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Error("server cert accepted for client auth")
	}
	if got := srv.NotAfter.Sub(srv.NotBefore); got > DefaultLeafLifetime+time.Hour {
		t.Errorf("server lifetime %v, want about %v", got, DefaultLeafLifetime)
	}
	if key, err := parseKeyPEM(srvKey); err != nil || !publicKeyMatches(srv, key) {
		t.Errorf("server key does not match: %v", err)
	}

	cliPEM, _, err := ca.IssueClient("worker-1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cli := mustCert(t, cliPEM)
	if cli.Subject.CommonName != "worker-1" {
		t.Errorf("client CN %q", cli.Subject.CommonName)
	}
	if _, err := cli.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("client cert: %v", err)
	}
	if _, err := cli.Verify(x509.VerifyOptions{Roots: roots}); err == nil {
		t.Error("client cert accepted for server auth")
	}
	// A leaf cannot sign: MaxPathLen 0 on the CA and no CA bit on the leaf.
	if srv.IsCA || cli.IsCA {
		t.Error("leaf certificate is a CA")
	}
}

func TestInvalidInput(t *testing.T) {
	ca, err := NewCA("", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	tooMany := make([]string, MaxHosts+1)
	for i := range tooMany {
		tooMany[i] = "h.example"
	}
	for _, tc := range []struct {
		name  string
		hosts []string
		want  error
	}{
		{"none", nil, ErrNoHosts},
		{"empty", []string{""}, ErrInvalidHost},
		{"space", []string{"bad host"}, ErrInvalidHost},
		{"leading hyphen", []string{"-x.example"}, ErrInvalidHost},
		{"empty label", []string{"a..example"}, ErrInvalidHost},
		{"url", []string{"https://x.example"}, ErrInvalidHost},
		{"too many", tooMany, ErrTooManyHosts},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, err := ca.IssueServer(tc.hosts, 0); !errors.Is(err, tc.want) {
				t.Errorf("IssueServer: %v, want %v", err, tc.want)
			}
			if _, _, err := SelfSigned(tc.hosts, 0); !errors.Is(err, tc.want) {
				t.Errorf("SelfSigned: %v, want %v", err, tc.want)
			}
		})
	}
	for _, name := range []string{"", "a\nb", strings.Repeat("x", 65)} {
		if _, _, err := ca.IssueClient(name, 0); !errors.Is(err, ErrInvalidName) {
			t.Errorf("IssueClient(%q): %v, want ErrInvalidName", name, err)
		}
	}
	if _, _, err := ca.IssueServer([]string{"*.sandbox.example", "localhost"}, 0); err != nil {
		t.Errorf("wildcard: %v", err)
	}
}

func TestSelfSignedIsItsOwnAnchor(t *testing.T) {
	certPEM, _, err := SelfSigned([]string{"localhost", "127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert := mustCert(t, certPEM)
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(certPEM) {
		t.Fatal("pool rejected the certificate")
	}
	if _, err := cert.Verify(x509.VerifyOptions{DNSName: "127.0.0.1", Roots: roots}); err != nil {
		t.Fatal(err)
	}
}

func TestFingerprint(t *testing.T) {
	certPEM, _, err := SelfSigned([]string{"localhost"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Fingerprint(certPEM)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(mustCert(t, certPEM).Raw)
	want := strings.ToUpper(hex.EncodeToString(sum[:]))
	if strings.ReplaceAll(got, ":", "") != want || len(got) != 32*3-1 {
		t.Errorf("Fingerprint = %s, want colon form of %s", got, want)
	}
	if _, err := Fingerprint([]byte("not pem")); !errors.Is(err, ErrNoPEM) {
		t.Errorf("garbage: %v, want ErrNoPEM", err)
	}
}

func TestLoadCA(t *testing.T) {
	dir := t.TempDir()
	ca, err := NewCA("load", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	other, err := NewCA("other", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leafPEM, leafKey, err := ca.IssueServer([]string{"localhost"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	caCert, caKey := write("ca.crt", ca.CertPEM), write("ca.key", ca.KeyPEM)

	loaded, err := LoadCA(caCert, caKey)
	if err != nil {
		t.Fatal(err)
	}
	if !loaded.Cert.Equal(ca.Cert) {
		t.Error("loaded a different certificate")
	}
	if _, _, err := loaded.IssueClient("c", time.Hour); err != nil {
		t.Errorf("loaded CA cannot issue: %v", err)
	}

	for _, tc := range []struct {
		name, cert, key string
		want            error
	}{
		{"wrong key", caCert, write("other.key", other.KeyPEM), ErrKeyMismatch},
		{"leaf is not a CA", write("leaf.crt", leafPEM), write("leaf.key", leafKey), ErrNotCA},
		{"no pem", write("junk.crt", []byte("junk")), caKey, ErrNoPEM},
		{"missing", filepath.Join(dir, "absent"), caKey, os.ErrNotExist},
	} {
		if _, err := LoadCA(tc.cert, tc.key); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}
