package systemd

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"github.com/sidecar-sandbox/sidecar/internal/testtool"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// make install with no settings writes a sidecar.env that listens on this host's own
// address and a certificate that names it and the host's name; the staged daemon, started
// as the unit starts it (the env file, the token as a credential), serves there.
func TestMakeInstallServesOnThisHost(t *testing.T) {
	testtool.Need(t, "make", "make", "it runs make install")
	root := t.TempDir()
	out, err := exec.Command("make", "-C", "..", "install", "DESTDIR="+root).CombinedOutput()
	if err != nil && strings.Contains(string(out), "cannot tell this host's address") {
		// A host without an IPv4 address of its own: the refusal names the settings.
		if !strings.Contains(string(out), "make install LISTEN_ADDR=") {
			t.Fatalf("the refusal does not name the make variables:\n%s", out)
		}
		t.Skipf("this host has no IPv4 address for make install to pick:\n%s", out)
	}
	if err != nil {
		t.Fatalf("make install: %v\n%s", err, out)
	}
	env := readEnvFile(t, filepath.Join(root, "etc/sidecar/sidecar.env"))
	listen := env["SIDECAR_LISTEN_ADDR"]
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		t.Fatalf("SIDECAR_LISTEN_ADDR=%q: %v", listen, err)
	}
	if !isLocalAddress(t, host) || net.ParseIP(host).IsLoopback() {
		t.Fatalf("SIDECAR_LISTEN_ADDR=%s is not an address of this host's interfaces", listen)
	}
	if !strings.Contains(string(out), "SANDBOX_REMOTE_URL=https://"+listen+"\n") {
		t.Errorf("make install does not print the URL it listens on (%s):\n%s", listen, out)
	}
	hostname, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}

	// The unit's start, against the staged tree. Only what would touch this host's real
	// daemon changes: the port (any free one), state and cgroups (a temporary dir, no
	// isolation), and the files' prefix (DESTDIR).
	state, err := os.MkdirTemp("/var/tmp", "sidecar-install-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(state) })
	env["SIDECAR_LISTEN_ADDR"] = net.JoinHostPort(host, "0")
	env["SIDECAR_TLS_CERT_FILE"] = root + env["SIDECAR_TLS_CERT_FILE"]
	env["SIDECAR_TLS_KEY_FILE"] = root + env["SIDECAR_TLS_KEY_FILE"]
	env["SIDECAR_STATE_DIR"] = state
	env["SIDECAR_WORK_ROOT"] = filepath.Join(state, "leases")
	env["SIDECAR_ISOLATION"] = "none"
	env["SIDECAR_DISK_QUOTA"] = "off"
	env["SCRIPT_ENABLED"] = "false"
	env["CREDENTIALS_DIRECTORY"] = filepath.Join(root, "etc/sidecar") // LoadCredential=auth-token
	serve := exec.Command(filepath.Join(root, "usr/local/bin/sidecar"), "serve")
	serve.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range env {
		serve.Env = append(serve.Env, k+"="+v)
	}
	var stderr testtool.Buffer
	serve.Stderr = &stderr
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = serve.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = serve.Process.Signal(syscall.SIGTERM)
		<-exited
	})
	url := regexp.MustCompile(`export SANDBOX_REMOTE_URL=https://(\S+)`)
	var addr string
	for deadline := time.Now().Add(60 * time.Second); addr == ""; {
		if m := url.FindStringSubmatch(stderr.String()); m != nil {
			addr = m[1]
			break
		}
		select {
		case <-exited:
			t.Fatalf("the staged daemon exited:\n%s", stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the staged daemon printed no URL:\n%s", stderr.String())
		}
	}
	if h, _, _ := net.SplitHostPort(addr); h != host {
		t.Fatalf("the staged daemon listens on %s, want the host's address %s", addr, host)
	}

	ca, err := os.ReadFile(filepath.Join(root, "etc/sidecar/tls/ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	// The certificate names the address the clients are told, and the host's name.
	for _, name := range []string{host, hostname} {
		c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: name},
		}}
		resp, err := c.Get("https://" + addr + "/healthz")
		if err != nil {
			t.Errorf("GET /healthz verifying the certificate for %q: %v", name, err)
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET /healthz as %q: %s", name, resp.Status)
		}
	}
}

// readEnvFile reads KEY=VALUE lines as systemd's EnvironmentFile= does for this file
// (comments and blank lines skipped; the example uses no quoting).
func readEnvFile(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: %q is not KEY=VALUE", path, line)
		}
		env[k] = v
	}
	return env
}

func isLocalAddress(t *testing.T, ip string) bool {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.String() == ip {
			return true
		}
	}
	return false
}
