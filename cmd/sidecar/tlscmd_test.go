package main

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func parseCertFile(t *testing.T, name string) *x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatalf("%s: no PEM", name)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

func TestTLSGen(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	var out bytes.Buffer
	if err := tlsGen([]string{"--dir", dir, "--host", "sandbox.internal", "--ip", "10.0.0.5", "--client", "worker"}, &out); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]os.FileMode{
		"ca.crt": 0o644, "ca.key": 0o600, "server.crt": 0o644, "server.key": 0o600,
		"client-worker.crt": 0o644, "client-worker.key": 0o600,
	} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s mode %o, want %o", name, fi.Mode().Perm(), want)
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 6 {
		t.Errorf("%d files in dir, want 6 (no temporary files)", len(entries))
	}

	roots := x509.NewCertPool()
	roots.AddCert(parseCertFile(t, filepath.Join(dir, "ca.crt")))
	srv := parseCertFile(t, filepath.Join(dir, "server.crt"))
	for _, host := range []string{"sandbox.internal", "10.0.0.5"} {
		if _, err := srv.Verify(x509.VerifyOptions{DNSName: host, Roots: roots}); err != nil {
			t.Errorf("server certificate for %s: %v", host, err)
		}
	}
	cli := parseCertFile(t, filepath.Join(dir, "client-worker.crt"))
	if _, err := cli.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("client certificate: %v", err)
	}
	for _, line := range []string{
		"SANDBOX_REMOTE_CA_FILE=" + filepath.Join(dir, "ca.crt"),
		"SANDBOX_REMOTE_URL=https://sandbox.internal:7443",
		"SANDBOX_REMOTE_CLIENT_CERT_FILE=" + filepath.Join(dir, "client-worker.crt"),
		"SIDECAR_TLS_CLIENT_CA_FILE=" + filepath.Join(dir, "ca.crt"),
		"sha256 ",
	} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("output lacks %q:\n%s", line, out.String())
		}
	}

	// Again without --force: refused, nothing changed.
	before, _ := os.ReadFile(filepath.Join(dir, "server.crt"))
	if err := tlsGen([]string{"--dir", dir, "--host", "other.internal"}, &out); err == nil || !strings.Contains(err.Error(), "--force") {
		t.Errorf("overwrite without --force: %v", err)
	}
	if after, _ := os.ReadFile(filepath.Join(dir, "server.crt")); !bytes.Equal(before, after) {
		t.Error("server.crt changed although the command was refused")
	}

	// With --force: a new server certificate from the same CA.
	caBefore, _ := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err := tlsGen([]string{"--dir", dir, "--host", "other.internal", "--force"}, &out); err != nil {
		t.Fatal(err)
	}
	if caAfter, _ := os.ReadFile(filepath.Join(dir, "ca.crt")); !bytes.Equal(caBefore, caAfter) {
		t.Error("--force replaced the CA")
	}
	if _, err := parseCertFile(t, filepath.Join(dir, "server.crt")).Verify(x509.VerifyOptions{DNSName: "other.internal", Roots: roots}); err != nil {
		t.Errorf("replaced server certificate: %v", err)
	}

	// A client added later is issued by the existing CA.
	if err := tlsGen([]string{"--dir", dir, "--client", "worker-2"}, &out); err != nil {
		t.Fatal(err)
	}
	if _, err := parseCertFile(t, filepath.Join(dir, "client-worker-2.crt")).Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("later client certificate: %v", err)
	}
}

func TestTLSGenRefusesBadInput(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{
		{"--host", "x.internal"},                // no --dir
		{"--dir", dir},                          // nothing to make
		{"--dir", dir, "--ip", "not-an-ip"},     // bad IP
		{"--dir", dir, "--host", "bad host"},    // bad name
		{"--dir", dir, "--client", "../escape"}, // client names files
		{"--dir", dir, "--host", "x.internal", "extra"},
	} {
		if err := tlsGen(args, &bytes.Buffer{}); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("refused commands left %d files", len(entries))
	}
}
