package client

import (
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/tls/certgen"
)

// A connection error names the setting that fixes it, and still matches what it wraps.
func TestConnectionErrorsNameTheFix(t *testing.T) {
	ca, err := certgen.NewCA("hint test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(caFile, ca.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	serve := func(hosts ...string) string {
		certPEM, keyPEM, err := ca.IssueServer(hosts, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusOK, map[string]any{"version": "test"})
		}))
		srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
		srv.StartTLS()
		t.Cleanup(srv.Close)
		return srv.URL
	}
	info := func(url, ca string) error {
		c, err := New(Config{URL: url, CAFile: ca, Token: testToken})
		if err != nil {
			t.Fatal(err)
		}
		c.retry = fastRetry
		defer c.CloseIdleConnections()
		_, err = c.Info(t.Context())
		return err
	}
	good := serve("127.0.0.1")
	if err := info(good, caFile); err != nil {
		t.Fatalf("the right CA and host: %v", err)
	}
	err = info(good, "")
	if err == nil || !strings.Contains(err.Error(), EnvCAFile) {
		t.Errorf("an untrusted CA: %v; want a hint naming %s", err, EnvCAFile)
	}
	if !errors.As(err, new(*tls.CertificateVerificationError)) {
		t.Errorf("the hinted error no longer wraps the TLS error: %v", err)
	}
	if err := info(serve("sidecar.example"), caFile); err == nil || !strings.Contains(err.Error(), "SIDECAR_TLS_HOSTS") {
		t.Errorf("a certificate for another host: %v; want a hint naming SIDECAR_TLS_HOSTS", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "https://" + ln.Addr().String()
	ln.Close()
	if err := info(closed, caFile); err == nil || !strings.Contains(err.Error(), EnvURL) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("a refused connection: %v; want a hint naming %s", err, EnvURL)
	}
}
