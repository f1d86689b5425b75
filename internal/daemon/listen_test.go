package daemon

import (
	"bytes"
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sidecar-sandbox/sidecar/tls/certgen"
)

// A daemon whose port is taken says so and names SIDECAR_LISTEN_ADDR.
func TestStartOnATakenPortNamesTheSetting(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	state, err := os.MkdirTemp("/var/tmp", "sidecar-daemon-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeTree(t, state) })
	_, err = Start(context.Background(), Config{
		SharedToken:   strings.Repeat("s", 32),
		StateDir:      state,
		WorkRoot:      filepath.Join(state, "leases"),
		ListenAddr:    taken.Addr().String(),
		TLS:           &tls.Config{},
		Isolation:     "none",
		DiskQuota:     "off",
		MaxLeases:     1,
		ScriptEnabled: false,
		Logger:        slog.New(slog.DiscardHandler),
	})
	if err == nil || !strings.Contains(err.Error(), "SIDECAR_LISTEN_ADDR") || !strings.Contains(err.Error(), "port is taken") {
		t.Fatalf("Start on a taken port: %v, want an error naming SIDECAR_LISTEN_ADDR", err)
	}
}

// removeTree removes a test's state dir unless something is still mounted under it.
func removeTree(t *testing.T, dir string) {
	mounts, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		t.Errorf("left %s: %v", dir, err)
		return
	}
	for line := range strings.SplitSeq(string(mounts), "\n") {
		if m := strings.Fields(line); len(m) > 4 && (m[4] == dir || strings.HasPrefix(m[4], dir+"/")) {
			t.Errorf("left %s: %s is mounted", dir, m[4])
			return
		}
	}
	_ = os.RemoveAll(dir)
}

func TestListenErrorHints(t *testing.T) {
	for _, c := range []struct {
		addr, want string
	}{
		{"192.0.2.1:7443", "no such address"}, // TEST-NET-1: never this host's
		{"127.0.0.1:99999", "SIDECAR_LISTEN_ADDR"},
	} {
		ln, err := net.Listen("tcp", c.addr)
		if err == nil {
			ln.Close()
			t.Fatalf("listening on %s worked", c.addr)
		}
		if got := listenError(c.addr, err).Error(); !strings.Contains(got, c.want) || !strings.Contains(got, "SIDECAR_LISTEN_ADDR") {
			t.Errorf("%s: %s, want %q and the setting", c.addr, got, c.want)
		}
	}
}

// A certificate that does not name the address the daemon listens on is warned of,
// naming the settings that fix it; one that names it, or a wildcard listen, is not.
func TestWarnCertMismatch(t *testing.T) {
	ca, err := certgen.NewCA("test", 0)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.IssueServer([]string{"localhost", "127.0.0.1"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &pair, nil }}
	for _, c := range []struct {
		addr string
		warn bool
	}{
		{"10.0.0.5:7443", true},
		{"127.0.0.1:7443", false},
		{"0.0.0.0:7443", false},
		{"[::]:7443", false},
	} {
		var logs bytes.Buffer
		warnCertMismatch(slog.New(slog.NewTextHandler(&logs, nil)), c.addr, cfg)
		got := logs.String()
		if c.warn != (got != "") {
			t.Errorf("%s: logged %q, want a warning: %v", c.addr, got, c.warn)
		}
		if c.warn && (!strings.Contains(got, "SIDECAR_TLS_HOSTS") || !strings.Contains(got, "--ip 10.0.0.5")) {
			t.Errorf("%s: %s, want the settings that fix it", c.addr, got)
		}
	}
}
