package network_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/internal/nettest"
	"github.com/sidecar-sandbox/sidecar/lease/netpolicy"
	"github.com/sidecar-sandbox/sidecar/lease/network"
)

// world is a lease namespace, two public test hosts, a private one, a metadata host and a
// resolver that names them, with a Manager attached to the lease.
type world struct {
	ns                      *os.File
	pub, neighbour, private *nettest.Host
	m                       *network.Manager
	cert                    *x509.CertPool
}

const leaseID = "l1"

func newWorld(t *testing.T, p netpolicy.Policy, privateAllow ...string) *world {
	w := &world{ns: nettest.NewNS(t)}
	w.pub = nettest.New(t, "198.51.100.0/24")
	w.neighbour = nettest.New(t, "203.0.113.0/24")
	w.private = nettest.New(t, "10.251.0.0/16", "169.254.169.254")
	for _, h := range []*nettest.Host{w.pub, w.neighbour, w.private} {
		serveHTTP(t, h.Listen(t, "tcp", ":80"), h.Name)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		fmt.Fprint(rw, "tls "+r.TLS.ServerName)
	}))
	srv.Listener = w.pub.Listen(t, "tcp", ":443")
	srv.StartTLS() // its certificate names example.com
	t.Cleanup(srv.Close)
	w.cert = x509.NewCertPool()
	w.cert.AddCert(srv.Certificate())

	names := map[string]netip.Addr{
		"example.com":       w.pub.Addr,
		"other.example.com": w.pub.Addr,
		"private.example":   w.private.Addr,
	}
	deny := &netpolicy.Deny{HostAddrs: network.HostAddrs}
	for _, s := range privateAllow {
		deny.PrivateAllow = append(deny.PrivateAllow, netip.MustParsePrefix(s))
	}
	w.m = network.New(network.Config{Deny: deny, Resolver: nettest.Resolver(nettest.DNS(t, names))})
	t.Cleanup(w.m.Close)
	if err := w.m.Attach(leaseID, w.ns, p); err != nil {
		t.Fatal(err)
	}
	return w
}

func serveHTTP(t *testing.T, ln net.Listener, name string) {
	srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		fmt.Fprint(rw, "host "+name+" "+r.Host)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
}

// dialInLease dials from inside the lease's namespace, as a lease process would.
func (w *world) dialInLease(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := nettest.InLease(w.ns, func() error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// get fetches u from inside the lease through its proxy (HTTP_PROXY's address).
func (w *world) get(t *testing.T, u string, serverName string) (int, string) {
	t.Helper()
	proxy, _ := url.Parse("http://" + network.ProxyAddr.String())
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		Proxy:           http.ProxyURL(proxy),
		DialContext:     w.dialInLease,
		TLSClientConfig: &tls.Config{RootCAs: w.cert, ServerName: serverName},
	}}
	defer c.CloseIdleConnections()
	resp, err := c.Get(u)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestInternetReachesPublicHostsAndNeverTheDenySet(t *testing.T) {
	w := newWorld(t, netpolicy.Policy{Egress: netpolicy.EgressInternet})
	if code, body := w.get(t, "http://"+w.pub.Addr.String()+"/", ""); code != 200 || body != "host "+w.pub.Name+" "+w.pub.Addr.String() {
		t.Fatalf("public host: %d %q", code, body)
	}
	for _, dest := range []string{
		w.private.Addr.String(),       // RFC 1918
		"169.254.169.254",             // metadata
		w.pub.Peer.String(),           // this host's own address
		"127.0.0.1:" + fmt.Sprint(53), // the daemon's loopback
		"[::ffff:127.0.0.1]:80",       // loopback, mapped
		w.pub.Addr.String() + ":25",   // port 25
	} {
		code, body := w.get(t, "http://"+dest+"/", "")
		if code != http.StatusForbidden || !strings.Contains(body, "deny set") {
			t.Errorf("%s: %d %q, want 403 naming the deny set", dest, code, body)
		}
	}
	s, _ := w.m.Stats(leaseID)
	if s.ConnectionsAllowed < 1 || s.Denied < 6 || s.BytesReceived == 0 || s.BytesSent == 0 {
		t.Errorf("stats %+v", s)
	}
}

func TestAllowlistByAddressAndByName(t *testing.T) {
	w := newWorld(t, netpolicy.Policy{Egress: netpolicy.EgressAllowlist, AllowOut: []string{"198.51.100.0/24:80", "example.com"}})
	if code, _ := w.get(t, "http://"+w.pub.Addr.String()+"/", ""); code != 200 {
		t.Errorf("allowed address: %d", code)
	}
	if code, _ := w.get(t, "http://"+w.neighbour.Addr.String()+"/", ""); code != http.StatusForbidden {
		t.Errorf("neighbour: %d, want 403", code)
	}
	if code, body := w.get(t, "https://example.com/", "example.com"); code != 200 || body != "tls example.com" {
		t.Errorf("allowed name over TLS: %d %q", code, body)
	}
	if code, body := w.get(t, "https://other.example.com/", "other.example.com"); code != 0 || !strings.Contains(body, "Forbidden") {
		t.Errorf("a name not in allow_out: %d %q, want the CONNECT refused", code, body)
	}
	if code, _ := w.get(t, "https://"+w.pub.Addr.String()+"/", "example.com"); code != 0 {
		t.Errorf("the allowed server by address on 443: %d, want refused", code)
	}
}

func TestForgedServerNameAndHostAreRefused(t *testing.T) {
	w := newWorld(t, netpolicy.Policy{Egress: netpolicy.EgressAllowlist, AllowOut: []string{"example.com"}})
	// A tunnel opened to the allowed name, with a TLS hello naming another server.
	c, err := w.dialInLease(context.Background(), "tcp", network.ProxyAddr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	tc := tls.Client(c, &tls.Config{ServerName: "other.example.com", RootCAs: w.cert})
	_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
	if err := tc.Handshake(); err == nil {
		t.Fatal("a TLS hello naming another server went through the tunnel")
	}
	// A plain request whose Host header names another server than its URL goes to the
	// URL's server, with the URL's host.
	c2, err := w.dialInLease(context.Background(), "tcp", network.ProxyAddr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	fmt.Fprintf(c2, "GET http://example.com/ HTTP/1.1\r\nHost: evil.example\r\n\r\n")
	resp, err = http.ReadResponse(bufio.NewReader(c2), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if want := "host " + w.pub.Name + " example.com"; string(b) != want {
		t.Fatalf("forged Host: got %q, want %q", b, want)
	}
}

func TestPrivateRangeNeedsOperatorAndLease(t *testing.T) {
	w := newWorld(t, netpolicy.Policy{Egress: netpolicy.EgressInternet}, "10.251.0.0/16")
	for _, u := range []string{"http://" + w.private.Addr.String() + "/", "http://private.example/"} {
		if code, _ := w.get(t, u, ""); code != http.StatusForbidden {
			t.Errorf("%s, the lease does not name it: %d", u, code)
		}
	}
	if err := w.m.SetPolicy(leaseID, netpolicy.Policy{Egress: netpolicy.EgressInternet, AllowOut: []string{w.private.Addr.String()}}); err != nil {
		t.Fatal(err)
	}
	if code, _ := w.get(t, "http://"+w.private.Addr.String()+"/", ""); code != 200 {
		t.Errorf("private host, operator and lease open it: %d", code)
	}
	if code, _ := w.get(t, "http://169.254.169.254/", ""); code != http.StatusForbidden {
		t.Errorf("metadata: %d", code)
	}
	if err := w.m.SetPolicy(leaseID, netpolicy.Policy{Egress: netpolicy.EgressAllowlist, AllowOut: []string{"10.0.0.1"}}); !errors.Is(err, netpolicy.ErrInvalid) {
		t.Errorf("a private address the operator did not open: %v", err)
	}
}

func TestNoneReachesNothingAndPolicyChangesApply(t *testing.T) {
	w := newWorld(t, netpolicy.Policy{Egress: netpolicy.EgressNone})
	if code, body := w.get(t, "http://"+w.pub.Addr.String()+"/", ""); code != http.StatusForbidden || !strings.Contains(body, "egress none") {
		t.Errorf("none: %d %q", code, body)
	}
	// Without the proxy there is no route at all: the connect fails at once.
	if c, err := w.dialInLease(context.Background(), "tcp", w.pub.Addr.String()+":80"); err == nil {
		c.Close()
		t.Error("a direct connection left the lease's namespace")
	}
	if err := w.m.SetPolicy(leaseID, netpolicy.Policy{Egress: netpolicy.EgressInternet}); err != nil {
		t.Fatal(err)
	}
	if code, _ := w.get(t, "http://"+w.pub.Addr.String()+"/", ""); code != 200 {
		t.Errorf("after the policy became internet: %d", code)
	}
}

func TestLeaseResolverAnswersByPolicy(t *testing.T) {
	w := newWorld(t, netpolicy.Policy{Egress: netpolicy.EgressAllowlist, AllowOut: []string{"example.com"}})
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return w.dialInLease(ctx, "udp", network.DNSAddr.String())
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addrs, err := r.LookupNetIP(ctx, "ip4", "example.com")
	if err != nil || len(addrs) != 1 || addrs[0] != w.pub.Addr {
		t.Fatalf("allowed name: %v %v", addrs, err)
	}
	if _, err := r.LookupNetIP(ctx, "ip4", "other.example.com"); err == nil {
		t.Error("a name outside the allow-list was answered")
	}
}

func TestDialPortReachesTheLeasesServer(t *testing.T) {
	w := newWorld(t, netpolicy.Policy{Egress: netpolicy.EgressNone})
	var ln net.Listener
	if err := nettest.InLease(w.ns, func() (err error) { ln, err = net.Listen("tcp", "0.0.0.0:8000"); return }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var served atomic.Bool
	go func() {
		c, err := ln.Accept()
		if err == nil {
			served.Store(true)
			_, _ = io.WriteString(c, "hi from the lease")
			c.Close()
		}
	}()
	c, err := w.m.DialPort(context.Background(), leaseID, 8000)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(c)
	c.Close()
	if string(b) != "hi from the lease" || !served.Load() {
		t.Errorf("read %q", b)
	}
	if _, err := w.m.DialPort(context.Background(), leaseID, 8001); !errors.Is(err, network.ErrPortUnreachable) {
		t.Errorf("nothing on 8001: %v", err)
	}
	if _, err := w.m.DialPort(context.Background(), "nope", 8000); !errors.Is(err, network.ErrUnknownLease) {
		t.Errorf("unknown lease: %v", err)
	}
}

func TestConnectionLimit(t *testing.T) {
	w := newWorld(t, netpolicy.Policy{Egress: netpolicy.EgressInternet})
	w.m.Detach(leaseID)
	m := network.New(network.Config{MaxConnections: 1, Deny: &netpolicy.Deny{HostAddrs: network.HostAddrs}})
	defer m.Close()
	if err := m.Attach(leaseID, w.ns, netpolicy.Policy{Egress: netpolicy.EgressInternet}); err != nil {
		t.Fatal(err)
	}
	open := func() (net.Conn, int) {
		c, err := w.dialInLease(context.Background(), "tcp", network.ProxyAddr.String())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "CONNECT %s:80 HTTP/1.1\r\nHost: x\r\n\r\n", w.pub.Addr)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		return c, resp.StatusCode
	}
	c1, code := open()
	defer c1.Close()
	if code != 200 {
		t.Fatalf("first: %d", code)
	}
	c2, code := open()
	defer c2.Close()
	if code != http.StatusForbidden {
		t.Errorf("second over a limit of 1: %d", code)
	}
}
