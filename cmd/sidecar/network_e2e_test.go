package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
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

	"github.com/gorilla/websocket"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/testtool"
)

// netDaemon is a daemon binary serving on loopback for the network tests, with the
// environment a CLI or client needs to reach it.
type netDaemon struct {
	bin  string
	work string
	env  map[string]string // SANDBOX_REMOTE_*
}

// startNetDaemon builds and starts the daemon under strict isolation (each lease in a
// network namespace of its own); it is stopped and its cgroups removed after the test.
func startNetDaemon(t *testing.T) *netDaemon {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the daemon binary")
	}
	if os.Geteuid() != 0 {
		t.Skip("network namespaces per lease need root (strict isolation)")
	}
	work, err := os.MkdirTemp("/var/tmp", "sidecar-net-e2e-") // not /tmp: a lease's private /tmp would hide it
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeUnmounted(t, work) })
	if err := os.Chmod(work, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := buildBinary(t, work)
	token, err := exec.Command(bin, "token").Output()
	if err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(work, "auth-token")
	if err := os.WriteFile(tokenFile, token, 0o600); err != nil {
		t.Fatal(err)
	}
	const cgroupParent = "sidecar-test-cli-net"
	serve := exec.Command(bin, "serve")
	serve.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"SIDECAR_STATE_DIR=" + filepath.Join(work, "state"),
		"SIDECAR_AUTH_TOKEN_FILE=" + tokenFile,
		"SIDECAR_TLS_SELF_SIGNED=true",
		"SIDECAR_LISTEN_ADDR=127.0.0.1:0",
		"SIDECAR_ISOLATION=strict",
		"SIDECAR_CGROUP_PARENT=" + cgroupParent,
		"SIDECAR_UID_RANGE=238000-238999",
		"SCRIPT_ENABLED=false",
	}
	stderr := &testtool.Buffer{}
	serve.Stderr = stderr
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = serve.Wait(); close(exited) }()
	d := &netDaemon{bin: bin, work: work, env: map[string]string{}}
	t.Cleanup(func() {
		// Leases outlive a stopped daemon (they are adopted at the next start): what the
		// test's commands acquired and left is released first, cgroups and all.
		if len(d.env) == 4 {
			c := d.client(t, "")
			leases, err := c.List(context.Background())
			for _, l := range leases {
				err = errors.Join(err, c.Release(context.Background(), l.ID))
			}
			if err != nil {
				t.Errorf("release the leases the test left: %v", err)
			}
		}
		_ = serve.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = serve.Process.Kill()
			<-exited
		}
		for _, p := range []string{"", "cpu", "cpuacct", "memory", "pids", "freezer"} {
			_ = syscall.Rmdir(filepath.Join("/sys/fs/cgroup", p, cgroupParent))
		}
		if t.Failed() {
			t.Logf("daemon log:\n%s", stderr.String())
		}
	})
	env := d.env
	deadline := time.Now().Add(60 * time.Second)
	for len(env) < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("no client lines from serve:\n%s", stderr.String())
		}
		select {
		case <-exited:
			t.Fatalf("serve exited:\n%s", stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		sc := bufio.NewScanner(strings.NewReader(stderr.String()))
		for sc.Scan() {
			if kv, ok := strings.CutPrefix(sc.Text(), "export "); ok {
				k, v, _ := strings.Cut(kv, "=")
				env[k] = v
			}
		}
	}
	return d
}

// client is a Go client of the daemon with its shared token, or with token.
func (d *netDaemon) client(t *testing.T, token string) *client.Client {
	t.Helper()
	if token == "" {
		b, err := os.ReadFile(d.env["SANDBOX_REMOTE_AUTH_TOKEN_FILE"])
		if err != nil {
			t.Fatal(err)
		}
		token = strings.TrimSpace(string(b))
	}
	c, err := client.New(client.Config{URL: d.env["SANDBOX_REMOTE_URL"], CAFile: d.env["SANDBOX_REMOTE_CA_FILE"], Token: token})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// cli runs the CLI against the daemon.
func (d *netDaemon) cli(args ...string) *exec.Cmd {
	cmd := exec.Command(d.bin, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + d.work}
	for k, v := range d.env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	return cmd
}

// echoServer is a TCP echo server on 127.0.0.1:PORT inside a lease, one connection at a
// time; it closes a connection that sends "bye".
const echoServer = `
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(8)
while True:
    c, _ = s.accept()
    while True:
        b = c.recv(65536)
        if not b or b.strip() == b"bye":
            break
        c.sendall(b)
    c.close()
`

// dialWhenListening dials port in the lease until the server there listens.
func dialWhenListening(t *testing.T, l *client.Lease, port int) net.Conn {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := l.DialPort(context.Background(), port)
		if err == nil {
			return conn
		}
		if !errors.Is(err, client.ErrPortUnreachable) || time.Now().After(deadline) {
			t.Fatalf("port-forward %d: %v", port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// echoRoundTrip writes msg and reads the same bytes back.
func echoRoundTrip(t *testing.T, conn net.Conn, msg string) {
	t.Helper()
	if _, err := io.WriteString(conn, msg); err != nil {
		t.Fatalf("write: %v", err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(conn, got); err != nil {
		t.Fatalf("read back: %v", err)
	}
	if string(got) != msg {
		t.Fatalf("echo %q, want %q", got, msg)
	}
}

// The Go client and the CLI against a real daemon: a policy at acquire and replaced,
// refused with a lease token; a TCP stream both ways through the client's port-forward
// and through `sidecar port-forward`; HTTP to a lease port through the ports route.
func TestLeaseNetworkClientAndCLI(t *testing.T) {
	testtool.Need(t, "/usr/bin/python3", "python3", "the lease runs an echo server in it")
	d := startNetDaemon(t)
	c := d.client(t, "")
	ctx := context.Background()

	policy := &apitype.NetworkPolicy{Egress: apitype.EgressAllowlist, AllowOut: []string{"example.com:443", "203.0.113.7"}}
	l, err := c.Acquire(ctx, apitype.AcquireRequest{SessionID: "net-client", Network: policy})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Release(context.Background()) })
	info := l.Info()
	if info.Network.Egress != apitype.EgressAllowlist || strings.Join(info.Network.AllowOut, ",") != "example.com:443,203.0.113.7" {
		t.Errorf("acquired network %+v, want %+v", info.Network, policy)
	}
	if info.NetworkStats == nil {
		t.Errorf("no network_stats on a lease in its own namespace")
	}

	// PUT network: the shared token replaces the policy; the lease's own token is refused.
	got, err := l.SetNetwork(ctx, apitype.NetworkPolicy{Egress: apitype.EgressNone})
	if err != nil || got.Network.Egress != apitype.EgressNone || len(got.Network.AllowOut) != 0 {
		t.Fatalf("SetNetwork none: %+v, %v", got.Network, err)
	}
	byToken := d.client(t, info.Token).OpenLease(l.ID(), info.Token)
	_, err = byToken.SetNetwork(ctx, apitype.NetworkPolicy{Egress: apitype.EgressInternet})
	var apiErr *client.APIError
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusForbidden || !errors.Is(err, client.ErrForbidden) {
		t.Fatalf("SetNetwork with the lease token: %v, want 403 forbidden", err)
	}
	if now, err := l.Get(ctx); err != nil || now.Network.Egress != apitype.EgressNone {
		t.Fatalf("after the refused PUT: %+v, %v; want none still", now.Network, err)
	}
	_, err = c.SetNetwork(ctx, l.ID(), apitype.NetworkPolicy{Egress: apitype.EgressAllowlist, AllowOut: []string{"10.1.2.3"}})
	if !errors.Is(err, client.ErrInvalidNetworkPolicy) {
		t.Errorf("allow_out in a private range: %v, want invalid_network_policy", err)
	}

	// Port-forward with the lease token: a stream both ways, the lease's close as EOF.
	const echoPort = 7000
	if _, err := byToken.Start(ctx, apitype.StartRequest{Argv: []string{"python3", "-c", echoServer, "7000"}}); err != nil {
		t.Fatal(err)
	}
	conn := dialWhenListening(t, byToken, echoPort)
	echoRoundTrip(t, conn, "hello through the daemon\n")
	big := strings.Repeat("0123456789abcdef", 40<<10/16) // several websocket messages each way
	echoRoundTrip(t, conn, big)
	if _, err := io.WriteString(conn, "bye\n"); err != nil {
		t.Fatal(err)
	}
	if n, err := conn.Read(make([]byte, 16)); n != 0 || err != io.EOF {
		t.Fatalf("after the lease's server closed: %d, %v; want io.EOF", n, err)
	}
	conn.Close()
	// A browser cannot set headers: the lease token as the bearer subprotocol works too.
	ca, err := os.ReadFile(d.env["SANDBOX_REMOTE_CA_FILE"])
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca)
	wsd := websocket.Dialer{TLSClientConfig: &tls.Config{RootCAs: roots}, Subprotocols: []string{
		apitype.PortForwardProtocol, apitype.BearerSubprotocolPrefix + base64.RawURLEncoding.EncodeToString([]byte(info.Token))}}
	u := strings.Replace(d.env["SANDBOX_REMOTE_URL"], "https://", "wss://", 1) + "/v1/leases/" + l.ID() + "/port-forward/7000"
	ws, resp, err := wsd.Dial(u, nil)
	if err != nil {
		t.Fatalf("port-forward with the bearer subprotocol: %v (%v)", err, resp)
	}
	if ws.Subprotocol() != apitype.PortForwardProtocol {
		t.Errorf("subprotocol %q, want %s", ws.Subprotocol(), apitype.PortForwardProtocol)
	}
	if err := ws.WriteMessage(websocket.BinaryMessage, []byte("subprotocol\n")); err != nil {
		t.Fatal(err)
	}
	if typ, msg, err := ws.ReadMessage(); err != nil || typ != websocket.BinaryMessage || string(msg) != "subprotocol\n" {
		t.Fatalf("echo over the bearer-subprotocol websocket: %d %q %v", typ, msg, err)
	}
	ws.Close()
	if _, err := byToken.DialPort(ctx, 7001); !errors.Is(err, client.ErrPortUnreachable) {
		t.Errorf("nothing listening: %v, want port_unreachable", err)
	}

	t.Run("cli port-forward", func(t *testing.T) {
		pf := d.cli("port-forward", l.ID(), ":7000")
		stdout, err := pf.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		pfErr := &testtool.Buffer{}
		pf.Stderr = pfErr
		if err := pf.Start(); err != nil {
			t.Fatal(err)
		}
		waited := false
		defer func() {
			if !waited {
				_ = pf.Process.Kill()
				_ = pf.Wait()
			}
		}()
		line, err := bufio.NewReader(stdout).ReadString('\n')
		m := regexp.MustCompile(`^Forwarding from (127\.0\.0\.1:\d+) -> 7000\n$`).FindStringSubmatch(line)
		if err != nil || m == nil {
			t.Fatalf("first line %q, %v; stderr %s", line, err, pfErr.String())
		}
		for i := range 2 { // each connection is its own websocket
			local, err := net.Dial("tcp", m[1])
			if err != nil {
				t.Fatal(err)
			}
			echoRoundTrip(t, local, "via the CLI "+string(rune('a'+i))+"\n")
			local.Close()
		}
		_ = pf.Process.Signal(syscall.SIGINT)
		err = pf.Wait()
		waited = true
		if err != nil {
			t.Fatalf("port-forward after Ctrl-C: %v; stderr %s", err, pfErr.String())
		}
	})

	t.Run("ports route", func(t *testing.T) {
		if err := l.Mkdir(ctx, "site"); err != nil {
			t.Fatal(err)
		}
		if err := l.WriteFile(ctx, "site/hello.txt", []byte("served from the lease\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Start(ctx, apitype.StartRequest{Argv: []string{"python3", "-m", "http.server", "--bind", "127.0.0.1", "--directory", "site", "8000"}}); err != nil {
			t.Fatal(err)
		}
		u, err := byToken.PortURL(8000)
		if err != nil {
			t.Fatal(err)
		}
		hc := &http.Client{Transport: byToken.PortTransport()}
		deadline := time.Now().Add(30 * time.Second)
		for {
			resp, err := hc.Get(u + "hello.txt")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				if string(body) != "served from the lease\n" {
					t.Fatalf("body %q", body)
				}
				break
			}
			if resp.StatusCode != http.StatusBadGateway || time.Now().After(deadline) {
				t.Fatalf("GET %shello.txt: %d %s", u, resp.StatusCode, body)
			}
			time.Sleep(20 * time.Millisecond)
		}
		// Another lease's token opens neither this lease's ports nor its port-forward.
		other, err := c.Acquire(ctx, apitype.AcquireRequest{SessionID: "net-client-other"})
		if err != nil {
			t.Fatal(err)
		}
		defer other.Release(context.Background())
		stranger := d.client(t, other.Token()).OpenLease(l.ID(), other.Token())
		resp, err := (&http.Client{Transport: stranger.PortTransport()}).Get(u + "hello.txt")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("another lease's token on the ports route: %d, want 403", resp.StatusCode)
		}
		if _, err := stranger.DialPort(ctx, echoPort); !errors.Is(err, client.ErrForbidden) {
			t.Errorf("another lease's token on port-forward: %v, want forbidden", err)
		}
	})

	t.Run("cli leases", func(t *testing.T) {
		out, err := d.cli("leases", "network", l.ID(), "--network", "internet", "--deny-out", "203.0.113.0/24,example.org").Output()
		if err != nil || strings.TrimSpace(string(out)) != "internet deny_out=203.0.113.0/24,example.org" {
			t.Fatalf("leases network: %v, %q", err, out)
		}
		out, err = d.cli("leases", "ls").Output()
		if err != nil || !regexp.MustCompile(`(?m)^`+l.ID()+`\s.*\sinternet\+2\s+\S+\s+\S+\s*$`).Match(out) {
			t.Fatalf("leases ls: %v\n%s", err, out)
		}
		out, err = d.cli("leases", "show", l.ID()).Output()
		var shown apitype.Lease
		if err != nil || json.Unmarshal(out, &shown) != nil || shown.NetworkStats == nil || shown.NetworkStats.ConnectionsOpen < 0 {
			t.Fatalf("leases show: %v\n%s", err, out)
		}
		if !strings.Contains(string(out), `"network_stats"`) {
			t.Errorf("leases show has no network_stats:\n%s", out)
		}
		out, err = d.cli("leases", "new", "net-cli", "--allow-out", "pypi.org,*.pythonhosted.org", "-o", "json").Output()
		var nl apitype.Lease
		if err != nil || json.Unmarshal(out, &nl) != nil {
			t.Fatalf("leases new --allow-out: %v\n%s", err, out)
		}
		defer c.Release(context.Background(), nl.ID)
		if nl.Network.Egress != apitype.EgressAllowlist || strings.Join(nl.Network.AllowOut, ",") != "pypi.org,*.pythonhosted.org" {
			t.Errorf("leases new --allow-out: network %+v", nl.Network)
		}
		out, err = d.cli("leases", "new", "net-cli-text", "--network", "none").Output()
		if err != nil || !regexp.MustCompile(`(?m)^network: none$`).Match(out) {
			t.Errorf("leases new --network none: %v\n%s", err, out)
		}
		if m := regexp.MustCompile(`(?m)^id:\s+(\S+)`).FindSubmatch(out); m != nil {
			defer c.Release(context.Background(), string(m[1]))
		}
		cmd := d.cli("leases", "new", "net-cli-bad", "--allow-out", "192.168.1.1")
		errOut := &testtool.Buffer{}
		cmd.Stderr = errOut
		if err := cmd.Run(); err == nil || !strings.Contains(errOut.String(), "invalid_network_policy") {
			t.Errorf("leases new with a private allow_out: %v, stderr %q", err, errOut.String())
		}
	})
}
