package tlsconfig

import (
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/tls/certgen"
)

// pki is a private CA written to a temporary directory, with helpers to issue into it.
type pki struct {
	t      *testing.T
	dir    string
	ca     *certgen.CA
	caFile string
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	ca, err := certgen.NewCA("test CA "+t.Name(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	p := &pki{t: t, dir: t.TempDir(), ca: ca}
	p.caFile = p.write("ca.crt", ca.CertPEM)
	return p
}

// write replaces name atomically, the way a careful operator or cert-manager does.
func (p *pki) write(name string, data []byte) string {
	p.t.Helper()
	path := filepath.Join(p.dir, name)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		p.t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		p.t.Fatal(err)
	}
	return path
}

// server issues a server pair for localhost and 127.0.0.1 and writes it as server.crt/key.
func (p *pki) server(lifetime time.Duration) (certFile, keyFile string) {
	p.t.Helper()
	certPEM, keyPEM, err := p.ca.IssueServer([]string{"localhost", "127.0.0.1"}, lifetime)
	if err != nil {
		p.t.Fatal(err)
	}
	return p.write("server.crt", certPEM), p.write("server.key", keyPEM)
}

func (p *pki) client(name string) (certFile, keyFile string) {
	p.t.Helper()
	certPEM, keyPEM, err := p.ca.IssueClient(name, time.Hour)
	if err != nil {
		p.t.Fatal(err)
	}
	return p.write(name+".crt", certPEM), p.write(name+".key", keyPEM)
}

// serve starts an HTTPS server on loopback with cfg that answers "ok <proto>" and returns
// its address. A plain http.Server rather than httptest: httptest adds its own certificate,
// which would shadow GetCertificate for clients that send no SNI.
func serve(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "ok %s", r.Proto)
		}),
		TLSConfig:         cfg,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          log.New(io.Discard, "", 0), // refused handshakes are the point of some tests
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.ServeTLS(ln, "", "")
	}()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
	return ln.Addr().String()
}

// get performs one request with a fresh transport using cfg.
func get(url string, cfg *tls.Config) (string, *tls.ConnectionState, error) {
	tr := &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get(url)
	if err != nil {
		return "", nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return string(body), resp.TLS, err
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}
