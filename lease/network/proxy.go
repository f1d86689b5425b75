package network

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sidecar-sandbox/sidecar/lease/netpolicy"
)

var errConnRefused = syscall.ECONNREFUSED

// ruleConnectionLimit refuses a connection over Config.MaxConnections.
const ruleConnectionLimit = "connection limit (SIDECAR_NETWORK_MAX_CONNECTIONS)"

// deniedError is a connection the policy refused.
type deniedError struct {
	dest string
	rule string
}

func (e *deniedError) Error() string {
	return fmt.Sprintf("sidecar: egress to %s refused by the lease's network policy (%s)", e.dest, e.rule)
}

func (ln *leaseNet) proxyServer() *http.Server {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			host, port, err := splitHostPort(addr, 80)
			if err != nil {
				return nil, err
			}
			return ln.dial(ctx, host, port)
		},
		// Every request dials, so that each is decided by the policy in force when it
		// is made: a pooled connection would outlive a replaced policy.
		DisableKeepAlives:     true,
		ResponseHeaderTimeout: 5 * time.Minute,
	}
	rp := &httputil.ReverseProxy{
		Rewrite:   func(pr *httputil.ProxyRequest) { pr.Out.Host = pr.In.Host },
		Transport: tr,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			writeRefusal(w, err)
		},
		ErrorLog: log.New(io.Discard, "", 0),
	}
	ln.closers = append(ln.closers, func() error { tr.CloseIdleConnections(); return nil })
	return &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch {
			case r.Method == http.MethodConnect:
				ln.connect(w, r)
			case r.URL.IsAbs() && r.URL.Scheme == "http":
				// The request goes to the URL's server with the URL's host: a Host
				// header naming another is replaced (net/http sets r.Host from an
				// absolute URL), so it cannot steer the request elsewhere.
				rp.ServeHTTP(w, r)
			default:
				http.Error(w, "sidecar: this is the lease's egress proxy: send absolute http:// requests or CONNECT host:port", http.StatusBadRequest)
			}
		}),
		ReadHeaderTimeout: 30 * time.Second,
		ErrorLog:          log.New(io.Discard, "", 0),
	}
}

func writeRefusal(w http.ResponseWriter, err error) {
	var d *deniedError
	if errors.As(err, &d) {
		http.Error(w, d.Error(), http.StatusForbidden)
		return
	}
	http.Error(w, "sidecar: "+err.Error(), http.StatusBadGateway)
}

// connect serves CONNECT host:port: the tunnel opens only to the address the daemon
// resolved and checked, and a TLS client inside it must name the same server in its SNI.
func (ln *leaseNet) connect(w http.ResponseWriter, r *http.Request) {
	host, port, err := splitHostPort(r.Host, 0)
	if err != nil || port == 0 {
		http.Error(w, "sidecar: CONNECT needs host:port", http.StatusBadRequest)
		return
	}
	up, err := ln.dial(r.Context(), host, port)
	if err != nil {
		writeRefusal(w, err)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		up.Close()
		http.Error(w, "sidecar: CONNECT needs HTTP/1.1", http.StatusBadRequest)
		return
	}
	client, brw, err := hj.Hijack()
	if err != nil {
		up.Close()
		return
	}
	ln.track(client)
	if _, err := io.WriteString(client, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		ln.untrack(client)
		client.Close()
		up.Close()
		return
	}
	_, byName := netip.ParseAddr(host)
	ln.splice(client, brw.Reader, up.(*countingConn), host, byName != nil)
}

// splice copies both ways until either side ends. The server's bytes flow at once (some
// protocols speak first); the client's wait until its first bytes, if a TLS ClientHello,
// name the server the tunnel was opened to.
func (ln *leaseNet) splice(client net.Conn, fromClient *bufio.Reader, up *countingConn, host string, checkSNI bool) {
	defer ln.untrack(client)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		up.copyTo(client)
		closeWrite(client)
	}()
	if checkSNI {
		if name, tls := peekServerName(fromClient); tls && name != "" && !strings.EqualFold(strings.TrimSuffix(name, "."), strings.TrimSuffix(host, ".")) {
			ln.count(false, name, "TLS server name differs from the CONNECT host "+host)
			client.Close()
			up.Close()
			wg.Wait()
			return
		}
	}
	up.copyFrom(client, fromClient)
	closeWrite(up)
	wg.Wait()
	client.Close()
	up.Close()
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	_ = c.Close()
}

// dial opens a connection for the lease to host:port if its policy allows it, to an
// address the daemon resolved and checked itself. The connection's slot is taken first,
// so that concurrent dials never hold more than MaxConnections.
func (ln *leaseNet) dial(ctx context.Context, host string, port int) (c net.Conn, err error) {
	dest := net.JoinHostPort(host, strconv.Itoa(port))
	if ln.stats.open.Add(1) > int64(ln.m.cfg.MaxConnections) {
		ln.stats.open.Add(-1)
		ln.count(false, dest, ruleConnectionLimit)
		return nil, &deniedError{dest, ruleConnectionLimit}
	}
	defer func() {
		if err != nil {
			ln.stats.open.Add(-1)
		}
	}()
	cp := ln.policy.Load()
	deny := ln.m.cfg.Deny
	var addrs []netip.Addr
	name := ""
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a.Unmap()}
	} else {
		name = host
		if v := cp.AllowsName(host, port); !v.Allowed {
			ln.count(false, dest, v.Rule)
			return nil, &deniedError{dest, v.Rule}
		}
		rctx, cancel := context.WithTimeout(ctx, dialTimeout)
		addrs, err = ln.m.cfg.Resolver.LookupNetIP(rctx, "ip", host)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("resolve %s: %w", host, err)
		}
	}
	var allowed []netip.Addr
	var first netpolicy.Verdict
	for i, a := range addrs {
		v := cp.Allows(deny, name, a, port)
		if i == 0 {
			first = v
		}
		if v.Allowed {
			allowed = append(allowed, a.Unmap())
		}
	}
	if len(allowed) == 0 {
		ln.count(false, dest, first.Rule)
		return nil, &deniedError{dest, first.Rule}
	}
	d := net.Dialer{Timeout: dialTimeout}
	for _, a := range allowed {
		if c, err = d.DialContext(ctx, "tcp", netip.AddrPortFrom(a, uint16(port)).String()); err == nil {
			ln.count(true, dest, "")
			return ln.counted(c), nil
		}
	}
	return nil, err
}

// count records one decision; a denial is logged for the operator.
func (ln *leaseNet) count(allowed bool, dest, rule string) {
	if allowed {
		ln.stats.allowed.Add(1)
		ln.m.total.allowed.Add(1)
		return
	}
	ln.stats.denied.Add(1)
	ln.m.total.denied.Add(1)
	ln.log.Info("lease connection denied", "audit", true, "destination", dest, "rule", rule)
}

func (ln *leaseNet) track(c net.Conn)   { ln.conns.Store(c, struct{}{}) }
func (ln *leaseNet) untrack(c net.Conn) { ln.conns.Delete(c) }

// counted wraps an outbound connection (its slot in stats.open already taken): its bytes
// count for the lease, and its close frees the slot.
func (ln *leaseNet) counted(c net.Conn) net.Conn {
	ln.m.total.open.Add(1)
	cc := &countingConn{Conn: c, ln: ln}
	ln.track(cc)
	return cc
}

type countingConn struct {
	net.Conn
	ln   *leaseNet
	once sync.Once
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.ln.stats.received.Add(int64(n))
		c.ln.m.total.received.Add(int64(n))
	}
	return n, err
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if n > 0 {
		c.ln.stats.sent.Add(int64(n))
		c.ln.m.total.sent.Add(int64(n))
	}
	return n, err
}

// spliceChunk is how much a tunnel moves between two updates of its lease's counters:
// the copies go socket to socket in the kernel (splice), which a counting wrapper would
// prevent.
const spliceChunk = 4 << 20

// copyTo moves what the remote end sends to w (the lease's end of a tunnel).
func (c *countingConn) copyTo(w io.Writer) {
	for {
		n, err := io.CopyN(w, c.Conn, spliceChunk)
		c.ln.stats.received.Add(n)
		c.ln.m.total.received.Add(n)
		if err != nil {
			return
		}
	}
}

// copyFrom moves what the lease sends (first what br holds, then the rest of conn) to the
// remote end.
func (c *countingConn) copyFrom(conn net.Conn, br *bufio.Reader) {
	if n := br.Buffered(); n > 0 {
		m, err := io.CopyN(c.Conn, br, int64(n))
		c.ln.stats.sent.Add(m)
		c.ln.m.total.sent.Add(m)
		if err != nil {
			return
		}
	}
	for {
		n, err := io.CopyN(c.Conn, conn, spliceChunk)
		c.ln.stats.sent.Add(n)
		c.ln.m.total.sent.Add(n)
		if err != nil {
			return
		}
	}
}

func (c *countingConn) CloseWrite() error {
	if tc, ok := c.Conn.(*net.TCPConn); ok {
		return tc.CloseWrite()
	}
	return nil
}

func (c *countingConn) Close() error {
	c.once.Do(func() {
		c.ln.stats.open.Add(-1)
		c.ln.m.total.open.Add(-1)
		c.ln.untrack(c)
	})
	return c.Conn.Close()
}

// splitHostPort reads host[:port], with def for a missing port.
func splitHostPort(hostport string, def int) (string, int, error) {
	host, p, err := net.SplitHostPort(hostport)
	if err != nil {
		if def == 0 {
			return "", 0, err
		}
		return strings.Trim(hostport, "[]"), def, nil
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, fmt.Errorf("port %q", p)
	}
	return host, port, nil
}
