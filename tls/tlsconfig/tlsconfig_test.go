package tlsconfig

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func newServerConfig(t *testing.T, p *pki, clientCAFile string) (*Reloader, *tls.Config) {
	t.Helper()
	certFile, keyFile := p.server(time.Hour)
	r, err := NewReloader(certFile, keyFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := Server(r, clientCAFile)
	if err != nil {
		t.Fatal(err)
	}
	return r, cfg
}

func TestHandshake(t *testing.T) {
	p := newPKI(t)
	_, srvCfg := newServerConfig(t, p, "")
	addr := serve(t, srvCfg)

	for _, tc := range []struct {
		name        string
		max         uint16
		wantVersion uint16
		wantProto   string
	}{
		{"tls1.3 h2", 0, tls.VersionTLS13, "HTTP/2.0"},
		{"tls1.2", tls.VersionTLS12, tls.VersionTLS12, "HTTP/2.0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Client(p.caFile, "", "")
			if err != nil {
				t.Fatal(err)
			}
			cfg.MaxVersion = tc.max
			body, state, err := get("https://"+addr+"/", cfg)
			if err != nil {
				t.Fatal(err)
			}
			if body != "ok "+tc.wantProto {
				t.Errorf("body %q, want ok %s", body, tc.wantProto)
			}
			if state.Version != tc.wantVersion {
				t.Errorf("version %x, want %x", state.Version, tc.wantVersion)
			}
		})
	}

	// The same server by name, over HTTP/1.1 only.
	cfg, _ := Client(p.caFile, "", "")
	cfg.NextProtos = []string{"http/1.1"}
	conn, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
	if got := conn.ConnectionState().NegotiatedProtocol; got != "http/1.1" {
		t.Errorf("ALPN %q, want http/1.1", got)
	}
}

func TestUntrustedServerRefused(t *testing.T) {
	_, srvCfg := newServerConfig(t, newPKI(t), "")
	addr := serve(t, srvCfg)
	cfg, err := Client(newPKI(t).caFile, "", "") // another CA
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := get("https://"+addr+"/", cfg); err == nil {
		t.Fatal("client trusted a server its CA did not issue")
	}
}

func TestOldProtocolsRefused(t *testing.T) {
	p := newPKI(t)
	_, srvCfg := newServerConfig(t, p, "")
	addr := serve(t, srvCfg)
	for _, v := range []uint16{tls.VersionTLS10, tls.VersionTLS11} {
		cfg, _ := Client(p.caFile, "", "")
		cfg.MinVersion, cfg.MaxVersion = v, v
		cfg.CipherSuites = nil // let the client offer what those versions can use
		_, _, err := get("https://"+addr+"/", cfg)
		if err == nil || !strings.Contains(err.Error(), "protocol version") {
			t.Errorf("%s: err = %v, want a protocol version alert", tls.VersionName(v), err)
		}
	}
}

func TestMutualTLS(t *testing.T) {
	p := newPKI(t)
	_, srvCfg := newServerConfig(t, p, p.caFile)
	addr := serve(t, srvCfg)
	url := "https://" + addr + "/"

	certFile, keyFile := p.client("worker")
	withCert, err := Client(p.caFile, certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := get(url, withCert); err != nil {
		t.Fatalf("client with a certificate: %v", err)
	}

	without, _ := Client(p.caFile, "", "")
	if _, _, err := get(url, without); err == nil {
		t.Error("client without a certificate was served")
	}

	stranger := newPKI(t)
	sCert, sKey := stranger.client("stranger")
	foreign, _ := Client(p.caFile, sCert, sKey)
	if _, _, err := get(url, foreign); err == nil {
		t.Error("client with a certificate from another CA was served")
	}
}

func TestReloadServesNewCertToNewConnectionsOnly(t *testing.T) {
	p := newPKI(t)
	r, srvCfg := newServerConfig(t, p, "")
	addr := serve(t, srvCfg)
	cliCfg, _ := Client(p.caFile, "", "")
	cliCfg.NextProtos = []string{"http/1.1"}

	open, err := tls.Dial("tcp", addr, cliCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	oldSerial := open.ConnectionState().PeerCertificates[0].SerialNumber
	openReader := bufio.NewReader(open)
	roundTrip(t, open, openReader)

	p.server(time.Hour) // replace the pair on disk
	if err := r.Reload(); err != nil {
		t.Fatal(err)
	}

	next, err := tls.Dial("tcp", addr, cliCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	if next.ConnectionState().PeerCertificates[0].SerialNumber.Cmp(oldSerial) == 0 {
		t.Error("new connection got the old certificate")
	}
	roundTrip(t, open, openReader) // the connection opened before the reload still works
}

// roundTrip sends one HTTP/1.1 request on an open connection and checks the answer.
func roundTrip(t *testing.T, conn *tls.Conn, br *bufio.Reader) {
	t.Helper()
	if _, err := io.WriteString(conn, "GET / HTTP/1.1\r\nHost: localhost\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "ok HTTP/1.1" {
		t.Fatalf("body %q", body)
	}
}

func TestBadPairKeepsCurrent(t *testing.T) {
	p := newPKI(t)
	r, _ := newServerConfig(t, p, "")
	before, _ := r.GetCertificate(nil)

	other := newPKI(t)
	_, otherKey := other.server(time.Hour)
	keyPEM, _ := os.ReadFile(otherKey)
	for name, spoil := range map[string]func(){
		"mismatched key": func() { p.write("server.key", keyPEM) },
		"garbage cert":   func() { p.write("server.crt", []byte("garbage")) },
		"missing key":    func() { os.Remove(filepath.Join(p.dir, "server.key")) },
	} {
		spoil()
		if err := r.Reload(); err == nil {
			t.Errorf("%s: Reload succeeded", name)
		}
		if after, _ := r.GetCertificate(nil); after != before {
			t.Errorf("%s: certificate replaced by a bad pair", name)
		}
	}
	if _, err := NewReloader(filepath.Join(p.dir, "server.crt"), filepath.Join(p.dir, "server.key"), nil); err == nil {
		t.Error("NewReloader accepted a bad pair")
	}
}

func TestWatchReloadsOnChange(t *testing.T) {
	p := newPKI(t)
	r, _ := newServerConfig(t, p, "")
	first, _ := r.GetCertificate(nil)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { r.Watch(ctx, 5*time.Millisecond) })
	defer func() { cancel(); wg.Wait() }()

	// Half a replacement (a new key, the old cert) must not displace the good pair.
	other := newPKI(t)
	_, otherKey := other.server(time.Hour)
	keyPEM, _ := os.ReadFile(otherKey)
	p.write("server.key", keyPEM)
	p.server(2 * time.Hour) // then the whole new pair lands
	eventually(t, "the watcher to load the new pair", func() bool {
		c, _ := r.GetCertificate(nil)
		return c != first && c.Leaf.NotAfter.After(first.Leaf.NotAfter)
	})
}

func TestExpiryWarning(t *testing.T) {
	for _, tc := range []struct {
		lifetime time.Duration
		warn     bool
	}{
		{10 * 24 * time.Hour, true},
		{90 * 24 * time.Hour, false},
	} {
		p := newPKI(t)
		certFile, keyFile := p.server(tc.lifetime)
		var logs bytes.Buffer
		r, err := NewReloader(certFile, keyFile, slog.New(slog.NewTextHandler(&logs, nil)))
		if err != nil {
			t.Fatal(err)
		}
		if got := time.Until(r.NotAfter()).Round(time.Hour); got != tc.lifetime {
			t.Errorf("NotAfter in %v, want %v", got, tc.lifetime)
		}
		if got := strings.Contains(logs.String(), "expires soon"); got != tc.warn {
			t.Errorf("lifetime %v: warned=%v, want %v\n%s", tc.lifetime, got, tc.warn, logs.String())
		}
	}
}

func TestConfigErrors(t *testing.T) {
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk.pem")
	os.WriteFile(junk, []byte("no certificates here"), 0o600)
	p := newPKI(t)
	certFile, keyFile := p.client("c")
	r, _ := newServerConfig(t, p, "")

	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"server junk client CA", second(Server(r, junk)), ErrNoCACertificates},
		{"client junk CA", second(Client(junk, "", "")), ErrNoCACertificates},
		{"client missing CA", second(Client(filepath.Join(dir, "absent"), "", "")), os.ErrNotExist},
		{"cert without key", second(Client("", certFile, "")), ErrIncompleteKeyPair},
		{"key without cert", second(Client("", "", keyFile)), ErrIncompleteKeyPair},
	} {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, tc.err, tc.want)
		}
	}
	cfg, err := Client("", "", "")
	if err != nil || cfg.RootCAs != nil {
		t.Errorf("no CA file: RootCAs=%v err=%v, want the system pool", cfg.RootCAs, err)
	}
}

func second[T any](_ T, err error) error { return err }
