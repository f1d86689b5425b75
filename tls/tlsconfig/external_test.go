package tlsconfig

// Tests with TLS clients no one here wrote: curl and openssl s_client.

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/internal/testtool"
	"github.com/sidecar-sandbox/sidecar/tls/certgen"
)

func lookTool(t *testing.T, name string) string {
	t.Helper()
	return testtool.Need(t, name, name, "it is a TLS client this package did not write")
}

// runTool runs a tool with an empty stdin and returns its combined output and error.
func runTool(t *testing.T, path string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + t.TempDir()} // no user curlrc or proxy
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestCurl(t *testing.T) {
	curl := lookTool(t, "curl")
	p := newPKI(t)

	t.Run("private CA", func(t *testing.T) {
		_, cfg := newServerConfig(t, p, "")
		url := "https://" + serve(t, cfg) + "/"
		out, err := runTool(t, curl, "-sS", "--cacert", p.caFile, url)
		if err != nil || out != "ok HTTP/2.0" {
			t.Errorf("curl --cacert: %v: %q", err, out)
		}
		if out, err := runTool(t, curl, "-sS", url); err == nil {
			t.Errorf("curl trusted the private CA without --cacert: %q", out)
		}
		if out, err := runTool(t, curl, "-sS", "--cacert", p.caFile, "--tlsv1.0", "--tls-max", "1.1", "--ciphers", "DEFAULT@SECLEVEL=0", url); err == nil || !strings.Contains(out, "alert protocol version") {
			t.Errorf("curl with TLS 1.0/1.1: want the server's protocol version alert, got %v: %q", err, out)
		}
	})

	t.Run("mTLS", func(t *testing.T) {
		_, cfg := newServerConfig(t, p, p.caFile)
		url := "https://" + serve(t, cfg) + "/"
		certFile, keyFile := p.client("curl")
		out, err := runTool(t, curl, "-sS", "--cacert", p.caFile, "--cert", certFile, "--key", keyFile, url)
		if err != nil || out != "ok HTTP/2.0" {
			t.Errorf("curl with a client certificate: %v: %q", err, out)
		}
		if out, err := runTool(t, curl, "-sS", "--cacert", p.caFile, url); err == nil {
			t.Errorf("curl without a client certificate was served: %q", out)
		}
	})

	t.Run("self-signed pinned", func(t *testing.T) {
		certFile, keyFile, _, err := certgen.EnsureSelfSigned(t.TempDir(), []string{"localhost", "127.0.0.1"})
		if err != nil {
			t.Fatal(err)
		}
		r, err := NewReloader(certFile, keyFile, nil)
		if err != nil {
			t.Fatal(err)
		}
		cfg, _ := Server(r, "")
		url := "https://" + serve(t, cfg) + "/"
		out, err := runTool(t, curl, "-sS", "--cacert", certFile, url)
		if err != nil || out != "ok HTTP/2.0" {
			t.Errorf("curl --cacert self-signed: %v: %q", err, out)
		}
	})
}

func TestOpenSSLClient(t *testing.T) {
	openssl := lookTool(t, "openssl")
	p := newPKI(t)
	_, cfg := newServerConfig(t, p, "")
	addr := serve(t, cfg)
	base := []string{"s_client", "-connect", addr, "-servername", "localhost", "-CAfile", p.caFile, "-verify_return_error", "-brief"}

	for _, tc := range []struct {
		name     string
		args     []string
		ok       bool
		evidence string // in the output: what shows the server, not the client, decided
	}{
		{"TLS 1.3", []string{"-tls1_3"}, true, "Protocol version: TLSv1.3"},
		{"TLS 1.2", []string{"-tls1_2"}, true, "Protocol version: TLSv1.2"},
		// SECLEVEL=0 makes OpenSSL 3 willing to offer the old versions, so the refusal we
		// see is the server's.
		{"TLS 1.1 refused", []string{"-tls1_1", "-cipher", "DEFAULT@SECLEVEL=0"}, false, "alert protocol version"},
		{"TLS 1.0 refused", []string{"-tls1", "-cipher", "DEFAULT@SECLEVEL=0"}, false, "alert protocol version"},
		{"CBC suite refused", []string{"-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-SHA"}, false, "alert handshake failure"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := runTool(t, openssl, append(base, tc.args...)...)
			if (err == nil) != tc.ok || !strings.Contains(out, tc.evidence) {
				t.Errorf("err=%v, want success=%v and %q in:\n%s", err, tc.ok, tc.evidence, out)
			}
			if tc.ok && !strings.Contains(out, "Verification: OK") {
				t.Errorf("certificate not verified:\n%s", out)
			}
		})
	}

	// The fingerprint certgen prints is the one openssl computes.
	certFile := filepath.Join(p.dir, "server.crt")
	out, err := runTool(t, openssl, "x509", "-in", certFile, "-noout", "-fingerprint", "-sha256")
	if err != nil {
		t.Fatal(err, out)
	}
	data, _ := os.ReadFile(certFile)
	fp, err := certgen.Fingerprint(data)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "="+fp) {
		t.Errorf("openssl says %q, certgen says %s", out, fp)
	}
}
