package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// SetNetwork replaces the network policy of lease id (PUT /v1/leases/{id}/network) and
// returns the lease. It needs the shared token: a lease token is refused (ErrForbidden),
// so code inside a lease cannot open its own egress. The new policy applies to
// connections opened from then on; open ones keep going.
func (c *Client) SetNetwork(ctx context.Context, id string, p apitype.NetworkPolicy) (apitype.Lease, error) {
	if c.fleet != nil {
		m, err := c.fleet.locate(ctx, id, "")
		if err != nil {
			return apitype.Lease{}, err
		}
		return m.c.SetNetwork(ctx, id, p)
	}
	return c.setNetwork(ctx, id, nil, p)
}

func (c *Client) setNetwork(ctx context.Context, id string, h *Lease, p apitype.NetworkPolicy) (apitype.Lease, error) {
	var l apitype.Lease
	// Putting the same policy twice changes nothing, so it is retried.
	err := c.doJSON(ctx, request{method: http.MethodPut, path: leasePath(id, "network"), json: p, lease: h, idempotent: true}, &l)
	return l, err
}

// SetNetwork replaces this lease's network policy with the handle's credential: a handle
// from Acquire (shared token) may, one opened with a lease token gets ErrForbidden.
func (l *Lease) SetNetwork(ctx context.Context, p apitype.NetworkPolicy) (apitype.Lease, error) {
	info, err := l.c.setNetwork(ctx, l.id, l, p)
	if err == nil {
		l.update(info)
	}
	return info, err
}

// checkPort refuses what the daemon would refuse, before a round trip.
func checkPort(port int) error {
	if port < 1 || port > 65535 {
		return fmt.Errorf("%w: port %d outside 1..65535", ErrInvalidRequest, port)
	}
	return nil
}

// errNoSidecar: a fleet handle whose lease no sidecar knows has no daemon to reach.
var errNoSidecar = fmt.Errorf("client: the lease is on no sidecar that answered: %w", ErrLeaseNotFound)

// portsPrefix is the escaped path of the lease's ports route for port, with a trailing
// slash: /v1/leases/{id}/ports/{port}/.
func (l *Lease) portsPrefix(port int) string {
	return leasePath(l.id, "ports", strconv.Itoa(port)) + "/"
}

// PortURL is the daemon URL that reaches http://127.0.0.1:port/ inside the lease
// (GET /v1/leases/{id}/ports/{port}/{path...}); append the path and query the server in
// the lease expects. Requests to it need this handle's credential: send them with
// PortTransport, or set the Authorization header yourself. The daemon does not forward
// that header to the server in the lease.
func (l *Lease) PortURL(port int) (string, error) {
	if err := checkPort(port); err != nil {
		return "", err
	}
	if l.c.base == nil {
		return "", errNoSidecar
	}
	return l.c.base.String() + l.portsPrefix(port), nil
}

// PortHeader is the header a request to a URL from PortURL needs: this handle's
// credential. For a websocket to the server in the lease, dial the PortURL (as wss://)
// with it; PortTransport adds it to plain HTTP requests. Keep it on the server side: it
// opens the whole lease (the shared token: every lease), not only the port.
func (l *Lease) PortHeader() http.Header {
	token := l.cred()
	if token == "" {
		token = l.c.token
	}
	h := http.Header{}
	if token != "" {
		h.Set(apitype.HeaderAuthorization, apitype.BearerScheme+" "+token)
	}
	return h
}

// PortTransport is an http.RoundTripper for requests to URLs from PortURL: it adds this
// handle's credential (the lease token, or the shared one) and sends them as the client
// sends its own. A request to any other URL — a redirect from the server in the lease to
// another path of the daemon or to another host, say — goes out without the credential.
// Use it as the Transport of an http.Client:
//
//	u, _ := lease.PortURL(8000)
//	hc := &http.Client{Transport: lease.PortTransport()}
//	resp, err := hc.Get(u + "index.html")
//
// A server in the lease that is not listening answers 502 with code port_unreachable.
func (l *Lease) PortTransport() http.RoundTripper {
	var next http.RoundTripper
	if l.c.hc != nil {
		next = l.c.hc.Transport
	}
	return portTransport{l: l, next: next}
}

type portTransport struct {
	l    *Lease
	next http.RoundTripper // nil: http.DefaultTransport
}

func (t portTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	next := t.next
	if next == nil {
		next = http.DefaultTransport
	}
	if !t.forLease(req) {
		return next.RoundTrip(req)
	}
	if auth := t.l.PortHeader().Get(apitype.HeaderAuthorization); auth != "" {
		// RoundTrippers must not modify the request they are given.
		req = req.Clone(req.Context())
		req.Header.Set(apitype.HeaderAuthorization, auth)
	}
	return next.RoundTrip(req)
}

// forLease reports whether req goes to this lease's ports route on the client's daemon.
func (t portTransport) forLease(req *http.Request) bool {
	base := t.l.c.base
	if base == nil || req.URL.Scheme != base.Scheme || req.URL.Host != base.Host {
		return false
	}
	prefix := leasePath(t.l.id, "ports") + "/"
	return strings.HasPrefix(req.URL.EscapedPath(), prefix)
}

// Port-forward frame size: each Write is sent in binary messages of at most this payload.
const maxPortFrame = 32 << 10

// DialPort opens a TCP connection to port inside the lease (on its loopback or any of its
// addresses), carried over the daemon's port-forward websocket (GET
// /v1/leases/{id}/port-forward/{port}): what `sidecar port-forward` uses for each
// connection it accepts. Nothing listening on the port is an *APIError with code
// port_unreachable (502).
//
// The connection has no half-close: when either side ends, the websocket closes and
// Read returns io.EOF. Keep a Read pending while the connection is open (as io.Copy
// does): the daemon's keepalive pings are answered while reading, and a connection that
// answers none for over twice the ping interval is dropped. A deadline that passes ends the connection for good (a websocket
// cannot resume a read that timed out), unlike a TCP connection's.
func (l *Lease) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if err := checkPort(port); err != nil {
		return nil, err
	}
	c := l.c
	if c.base == nil {
		return nil, errNoSidecar
	}
	u := *c.base
	u.Scheme = "wss"
	u.Path, u.RawPath = "", ""
	target := u.String() + leasePath(l.id, "port-forward", strconv.Itoa(port))
	d := *c.ws
	d.Subprotocols = []string{apitype.PortForwardProtocol}
	conn, resp, err := d.DialContext(ctx, target, l.PortHeader())
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			defer resp.Body.Close()
			return nil, errorFromResponse(resp)
		}
		return nil, fmt.Errorf("client: port-forward %d: %w", port, withHint(err))
	}
	if conn.Subprotocol() != apitype.PortForwardProtocol {
		conn.Close()
		return nil, fmt.Errorf("client: port-forward %d: the daemon chose subprotocol %q, want %s", port, conn.Subprotocol(), apitype.PortForwardProtocol)
	}
	if resp != nil {
		l.tokenRefreshed(resp.Header.Get(apitype.HeaderLeaseToken))
	}
	return &wsConn{ws: conn}, nil
}

// wsConn is a net.Conn over a websocket whose binary messages carry a byte stream.
type wsConn struct {
	ws *websocket.Conn

	rmu  sync.Mutex // one reader at a time (gorilla allows one)
	cur  io.Reader  // the message being read; nil between messages
	rerr error      // the read error that ended the stream; gorilla must not be read again after one

	wmu sync.Mutex // one writer at a time

	closeOnce sync.Once
	closeErr  error
}

func (c *wsConn) Read(p []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if c.rerr != nil {
		return 0, c.rerr
	}
	for {
		if c.cur == nil {
			typ, r, err := c.ws.NextReader()
			if err != nil {
				c.rerr = streamEnd(err)
				return 0, c.rerr
			}
			if typ != websocket.BinaryMessage {
				continue // the stream is binary; a text message carries no stream bytes
			}
			c.cur = r
		}
		n, err := c.cur.Read(p)
		if errors.Is(err, io.EOF) {
			c.cur = nil
			err = nil
			if n == 0 {
				continue
			}
		}
		if err != nil {
			c.rerr = streamEnd(err)
			return n, c.rerr
		}
		return n, nil
	}
}

// streamEnd turns the websocket's orderly end (a close frame of either kind the daemon
// sends when the lease's side ended) into io.EOF, as a TCP connection would say it.
func streamEnd(err error) error {
	if websocket.IsCloseError(err, websocket.CloseNormalClosure, websocket.CloseGoingAway, websocket.CloseNoStatusReceived) {
		return io.EOF
	}
	if errors.Is(err, net.ErrClosed) {
		return net.ErrClosed
	}
	return err
}

func (c *wsConn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	n := 0
	for len(p) > 0 {
		chunk := p[:min(len(p), maxPortFrame)]
		if err := c.ws.WriteMessage(websocket.BinaryMessage, chunk); err != nil {
			return n, err
		}
		n += len(chunk)
		p = p[len(chunk):]
	}
	return n, nil
}

// Close says goodbye with a close frame, then closes the connection without waiting for
// the daemon's reply (the stream is over either way).
func (c *wsConn) Close() error {
	c.closeOnce.Do(func() {
		_ = c.ws.WriteControl(websocket.CloseMessage,
			websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
		c.closeErr = c.ws.Close()
	})
	return c.closeErr
}

func (c *wsConn) LocalAddr() net.Addr                { return c.ws.LocalAddr() }
func (c *wsConn) RemoteAddr() net.Addr               { return c.ws.RemoteAddr() }
func (c *wsConn) SetReadDeadline(t time.Time) error  { return c.ws.SetReadDeadline(t) }
func (c *wsConn) SetWriteDeadline(t time.Time) error { return c.ws.SetWriteDeadline(t) }

func (c *wsConn) SetDeadline(t time.Time) error {
	return errors.Join(c.ws.SetReadDeadline(t), c.ws.SetWriteDeadline(t))
}
