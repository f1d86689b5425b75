package daemon_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/daemon"
	"github.com/sidecar-sandbox/sidecar/internal/nettest"
)

// fetchPy fetches each of argv[1:] through the lease's proxy variables, as pip and
// requests do, and prints a line per URL: the status and body, or "refused <code>
// <body>" / "error <reason>", newlines as spaces. One interpreter for them all: a python3
// start is most of a fetch's time (seconds under make vm-test's emulation).
const fetchPy = `
import sys, urllib.request, urllib.error
for url in sys.argv[1:]:
    try:
        r = urllib.request.urlopen(url, timeout=10)
        out = "%d %s" % (r.status, r.read().decode())
    except urllib.error.HTTPError as e:
        out = "refused %d %s" % (e.code, e.read().decode())
    except Exception as e:
        out = "error %s" % e
    print(" ".join(out.split("\n")).strip(), flush=True)
`

// serverPy serves its directory on argv[1] (all addresses), and a websocket echo at /ws;
// it creates the file argv[2] once it listens.
const serverPy = `
import sys, base64, hashlib, http.server, socketserver
class H(http.server.SimpleHTTPRequestHandler):
    def do_GET(self):
        if self.path != "/ws":
            return super().do_GET()
        key = self.headers["Sec-WebSocket-Key"]
        acc = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
        self.send_response(101); self.send_header("Upgrade", "websocket"); self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", acc); self.end_headers(); self.wfile.flush()
        rf, wf = self.rfile, self.wfile
        while True:
            h = rf.read(2)
            if len(h) < 2: return
            op, n = h[0] & 15, h[1] & 127
            if n == 126: n = int.from_bytes(rf.read(2), "big")
            mask = rf.read(4); data = bytes(b ^ mask[i % 4] for i, b in enumerate(rf.read(n)))
            if op == 8: return
            wf.write(bytes([0x80 | op, len(data)]) + data); wf.flush()
    def log_message(self, *a): pass
socketserver.TCPServer.allow_reuse_address = True
srv = http.server.ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), H)
open(sys.argv[2], "w").close()
srv.serve_forever()
`

type netWorld struct {
	d                       *testDaemon
	pub, neighbour, private *nettest.Host
	hostLoopback            string // a server on the host's 127.0.0.1
}

func startNetworkDaemon(t *testing.T, mods ...func(*daemon.Config)) *netWorld {
	t.Helper()
	needRoot(t)
	if isolation() != "strict" {
		t.Skip("lease networks need strict isolation")
	}
	nettest.Require(t)
	needPython(t)
	w := &netWorld{}
	w.pub = nettest.New(t, "198.51.100.0/24")
	w.neighbour = nettest.New(t, "203.0.113.0/24")
	w.private = nettest.New(t, "10.252.0.0/16", "169.254.169.254")
	for _, h := range []*nettest.Host{w.pub, w.neighbour, w.private} {
		serveText(t, h.Listen(t, "tcp", ":80"), "host "+h.Name)
	}
	loop, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveText(t, loop, "host loopback")
	w.hostLoopback = loop.Addr().String()
	resolver := nettest.DNS(t, map[string]netip.Addr{"pub.example": w.pub.Addr, "neighbour.example": w.neighbour.Addr})
	w.d = startDaemon(t, append([]func(*daemon.Config){func(c *daemon.Config) {
		c.Network.Resolver = resolver
	}}, mods...)...)
	return w
}

func serveText(t *testing.T, ln net.Listener, text string) {
	srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) { fmt.Fprint(rw, text) })}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
}

// fetchAll fetches urls from inside l, in order, and returns a result per URL (fetchPy).
func fetchAll(t *testing.T, l *client.Lease, urls ...string) []string {
	t.Helper()
	r, err := l.Exec(context.Background(), apitype.ExecRequest{Argv: append([]string{"python3", "-c", fetchPy}, urls...)})
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Split(strings.TrimSuffix(r.Stdout, "\n"), "\n")
	if r.ExitCode != 0 || len(got) != len(urls) {
		t.Fatalf("fetch %q: exit %d: %q %q", urls, r.ExitCode, r.Stdout, r.Stderr)
	}
	return got
}

func fetch(t *testing.T, l *client.Lease, url string) string {
	t.Helper()
	return fetchAll(t, l, url)[0]
}

// serve starts the test server on port in the lease, serving a.html = content, and waits
// until it listens inside the lease.
func serve(t *testing.T, l *client.Lease, port int, content string) {
	t.Helper()
	ctx := context.Background()
	if err := l.WriteFile(ctx, "srv/a.html", []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	ready := fmt.Sprintf(".listening-%d-%d", port, time.Now().UnixNano())
	if _, err := l.Start(ctx, apitype.StartRequest{Argv: []string{"python3", "-c", serverPy, fmt.Sprint(port), ready}, Cwd: "srv"}); err != nil {
		t.Fatal(err)
	}
	r, err := l.Exec(ctx, sh(fmt.Sprintf(`for i in $(seq 600); do [ -e srv/%s ] && exit 0; sleep 0.1; done; exit 1`, ready)))
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("server on %d did not come up: %v %+v", port, err, r)
	}
}

func TestLeasesDoNotReachEachOtherOrTheHost(t *testing.T) {
	w := startNetworkDaemon(t)
	a, b := w.d.acquire("net-a"), w.d.acquire("net-b")
	serve(t, a, 8000, "from A")
	serve(t, b, 8000, "from B") // the same port: each lease has its own
	if got := fetch(t, b, "http://127.0.0.1:8000/a.html"); got != "200 from B" {
		t.Errorf("B's own server: %q", got)
	}
	// The lease's 127.0.0.1 is its own (NO_PROXY keeps it off the proxy): the host's
	// services and the daemon's port are not there. Through the proxy, private ranges,
	// the metadata address and this host are denied; a public host is reached, by
	// address and by name.
	urls := []string{
		"http://" + w.hostLoopback + "/", w.d.url + "/healthz",
		"http://" + w.private.Addr.String() + "/", "http://169.254.169.254/", "http://" + w.pub.Peer.String() + "/",
		"http://" + w.pub.Addr.String() + "/", "http://pub.example/",
	}
	got := fetchAll(t, a, urls...)
	for i, what := range []string{"the host's loopback", "the daemon's port"} {
		if !strings.Contains(got[i], "Connection refused") {
			t.Errorf("%s (%s) from a lease: %q, want its own loopback's refusal", what, urls[i], got[i])
		}
	}
	for i, what := range []string{"a private address", "cloud metadata", "this host's address"} {
		if g := got[2+i]; !strings.HasPrefix(g, "refused 403") || !strings.Contains(g, "deny set") {
			t.Errorf("%s (%s) through the proxy: %q, want 403 naming the deny set", what, urls[2+i], g)
		}
	}
	for i, what := range []string{"by address", "by name"} {
		if g := got[5+i]; g != "200 host "+w.pub.Name {
			t.Errorf("a public host under the default policy, %s: %q", what, g)
		}
	}
	// Without the proxy there is no route out of the lease at all; its resolver answers.
	r, err := a.Exec(context.Background(), sh(`python3 -c "
import socket
for addr in [('`+strings.Replace(w.hostLoopback, ":", "',", 1)+`), ('`+w.pub.Addr.String()+`', 80), ('169.254.169.254', 80)]:
    try: socket.create_connection(addr, 3); print('reached', addr)
    except OSError as e: print('no', e.errno)
print(socket.gethostbyname('pub.example'))
"`))
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	if err != nil || strings.Contains(r.Stdout, "reached") || len(lines) != 4 {
		t.Errorf("direct connections from a lease: %q %q %v", r.Stdout, r.Stderr, err)
	} else if lines[3] != w.pub.Addr.String() {
		t.Errorf("the lease's resolver: %q", lines[3])
	}
	info, err := a.Get(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if s := info.NetworkStats; s == nil || s.ConnectionsAllowed < 2 || s.ConnectionsDenied < 3 || s.ConnectionsOpen != 0 || s.BytesReceived == 0 {
		t.Errorf("stats %+v", s)
	}
	_, _, metrics := w.d.raw("GET", "/metrics", testToken, nil, nil)
	if !strings.Contains(string(metrics), `sidecar_network_connections_total{verdict="denied"}`) {
		t.Error("metrics lack sidecar_network_connections_total")
	}
}

func TestLeaseNetworkPolicies(t *testing.T) {
	w := startNetworkDaemon(t, func(c *daemon.Config) { c.Network.PrivateAllow = []string{"10.252.0.0/16"} })
	ctx := context.Background()
	l, err := w.d.client.Acquire(ctx, apitype.AcquireRequest{SessionID: "allow", Network: &apitype.NetworkPolicy{
		Egress: apitype.EgressAllowlist, AllowOut: []string{w.pub.Addr.String(), w.private.Addr.String()}}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	got := fetchAll(t, l, "http://"+w.pub.Addr.String()+"/", "http://"+w.neighbour.Addr.String()+"/",
		"http://"+w.private.Addr.String()+"/", "http://169.254.169.254/")
	if got[0] != "200 host "+w.pub.Name {
		t.Errorf("the allowed host: %q", got[0])
	}
	if !strings.HasPrefix(got[1], "refused 403") {
		t.Errorf("its neighbour: %q", got[1])
	}
	if got[2] != "200 host "+w.private.Name {
		t.Errorf("a private host the operator and the lease both opened: %q", got[2])
	}
	if !strings.HasPrefix(got[3], "refused 403") {
		t.Errorf("metadata under an allow-list: %q", got[3])
	}
	// A lease token cannot open its own lease's egress.
	status, hdr, body := w.d.raw("PUT", "/v1/leases/"+l.ID()+"/network", l.Token(), strings.NewReader(`{"egress":"internet"}`), nil)
	wantProblem(t, status, hdr, body, 403, apitype.CodeForbidden)
	status, _, body = w.d.raw("PUT", "/v1/leases/"+l.ID()+"/network", testToken, strings.NewReader(`"none"`), nil)
	if status != 200 || !strings.Contains(string(body), `"egress":"none"`) {
		t.Fatalf("replace with none: %d %s", status, body)
	}
	if got := fetch(t, l, "http://"+w.pub.Addr.String()+"/"); !strings.HasPrefix(got, "refused 403") || !strings.Contains(got, "egress none") {
		t.Errorf("after the policy became none: %q", got)
	}
	status, hdr, body = w.d.raw("PUT", "/v1/leases/"+l.ID()+"/network", testToken, strings.NewReader(`{"egress":"allowlist","allow_out":["10.9.0.1"]}`), nil)
	wantProblem(t, status, hdr, body, 400, apitype.CodeInvalidNetworkPolicy)
	if !strings.Contains(string(body), "SIDECAR_NETWORK_PRIVATE_ALLOW") {
		t.Errorf("the refusal does not name the setting: %s", body)
	}
}

func TestLeasePortsThroughTheDaemon(t *testing.T) {
	w := startNetworkDaemon(t)
	a, b := w.d.acquire("ports-a"), w.d.acquire("ports-b")
	serve(t, a, 8000, "from A")
	path := "/v1/leases/" + a.ID() + "/ports/8000/a.html"
	for _, tok := range []string{a.Token(), testToken} {
		if status, _, body := w.d.raw("GET", path, tok, nil, nil); status != 200 || string(body) != "from A" {
			t.Errorf("GET %s: %d %q", path, status, body)
		}
	}
	status, hdr, body := w.d.raw("GET", path, b.Token(), nil, nil)
	wantProblem(t, status, hdr, body, 403, apitype.CodeForbidden)
	status, hdr, body = w.d.raw("GET", "/v1/leases/"+a.ID()+"/ports/8001/", a.Token(), nil, nil)
	wantProblem(t, status, hdr, body, 502, apitype.CodePortUnreachable)

	pool := x509.NewCertPool()
	pem, _ := os.ReadFile(w.d.caFile)
	pool.AppendCertsFromPEM(pem)
	dialer := websocket.Dialer{TLSClientConfig: &tls.Config{RootCAs: pool}, HandshakeTimeout: 10 * time.Second}
	wsURL := "wss" + strings.TrimPrefix(w.d.url, "https")
	hdrs := http.Header{"Authorization": {"Bearer " + a.Token()}}

	// A websocket through the ports proxy echoes.
	c, _, err := dialer.Dial(wsURL+"/v1/leases/"+a.ID()+"/ports/8000/ws", hdrs)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WriteMessage(websocket.TextMessage, []byte("ping through the daemon")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, msg, err := c.ReadMessage(); err != nil || string(msg) != "ping through the daemon" {
		t.Errorf("echo: %q %v", msg, err)
	}
	c.Close()

	// A TCP stream over the port-forward websocket, both ways.
	pf := dialer
	pf.Subprotocols = []string{apitype.PortForwardProtocol}
	c, _, err = pf.Dial(wsURL+"/v1/leases/"+a.ID()+"/port-forward/8000", hdrs)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.WriteMessage(websocket.BinaryMessage, []byte("GET /a.html HTTP/1.0\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	var got strings.Builder
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		kind, msg, err := c.ReadMessage()
		if err != nil {
			break
		}
		if kind == websocket.BinaryMessage {
			got.Write(msg)
		}
	}
	resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(got.String())), nil)
	if err != nil {
		t.Fatalf("port-forward read %q: %v", got.String(), err)
	}
	rb, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(rb) != "from A" {
		t.Errorf("port-forward: %d %q", resp.StatusCode, rb)
	}
	if _, _, err := pf.Dial(wsURL+"/v1/leases/"+a.ID()+"/port-forward/8000", http.Header{"Authorization": {"Bearer " + b.Token()}}); err == nil {
		t.Error("another lease's token opened a port-forward")
	}
}
