package sidecar

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/lease/netpolicy"
	"github.com/sidecar-sandbox/sidecar/lease/network"
)

// Network is the lease network (lease/network): each lease's traffic, and the way into
// its namespace. nil in ServerOptions: leases share the host's network.
type Network interface {
	Stats(leaseID string) (network.Stats, bool)
	Totals() network.Stats
	DialPort(ctx context.Context, leaseID string, port int) (net.Conn, error)
}

// portProxyHost is how the ports proxy's transport names a lease port as a URL host, so
// that its idle connections are pooled per lease and port ("<lease>.<port>"; lease ids
// have no dots).
func portProxyHost(leaseID string, port int) string { return leaseID + "." + strconv.Itoa(port) }

func newPortTransport(nw Network) *http.Transport {
	return &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			host, _, _ := net.SplitHostPort(addr)
			id, p, _ := strings.Cut(host, ".")
			port, _ := strconv.Atoi(p)
			return nw.DialPort(ctx, id, port)
		},
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     30 * time.Second,
	}
}

func (s *Server) handleSetNetwork(w http.ResponseWriter, r *http.Request, _ principal) error {
	var req apitype.NetworkPolicy
	if err := s.decodeJSON(w, r, &req); err != nil {
		return err
	}
	l, err := s.opts.Leases.SetNetwork(r.Context(), r.PathValue("id"), netpolicy.Policy(req))
	if err != nil {
		return err
	}
	s.log.InfoContext(r.Context(), "lease network replaced", "audit", true, "lease", l.ID, "egress", req.Egress, "allow_out", len(req.AllowOut), "deny_out", len(req.DenyOut))
	return writeJSON(w, http.StatusOK, s.inspect(r.Context(), l))
}

// leasePort reads the route's lease and port, for a lease that is active and has a
// network of its own.
func (s *Server) leasePort(r *http.Request) (string, int, error) {
	if s.opts.Network == nil {
		return "", 0, errorf(http.StatusNotFound, apitype.CodeCapabilityDisabled, "leases share the host's network (SIDECAR_NETWORK_ISOLATION=host, or isolation none): the daemon has no way into a lease's ports")
	}
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || port < 1 || port > 65535 {
		return "", 0, badRequest("port %q is not 1..65535", r.PathValue("port"))
	}
	l, err := s.opts.Leases.Get(r.PathValue("id"))
	if err != nil {
		return "", 0, err
	}
	s.opts.Leases.Touch(l.ID)
	return l.ID, port, nil
}

// handlePorts proxies HTTP (websocket upgrades included) to a server listening on the
// port inside the lease. The daemon's credentials are not passed on.
func (s *Server) handlePorts(w http.ResponseWriter, r *http.Request, _ principal) error {
	id, port, err := s.leasePort(r)
	if err != nil {
		return err
	}
	prefix := apitype.RouteLeases + "/" + url.PathEscape(id) + "/ports/" + r.PathValue("port")
	rest := strings.TrimPrefix(r.URL.EscapedPath(), prefix) // "/" and what follows
	var proxyErr error
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", portProxyHost(id, port)
			pr.Out.URL.RawPath = rest
			pr.Out.URL.Path, _ = url.PathUnescape(rest)
			// Development servers check Host against localhost.
			pr.Out.Host = "localhost:" + strconv.Itoa(port)
			pr.Out.Header.Del(apitype.HeaderAuthorization)
			pr.Out.Header.Set("X-Forwarded-Prefix", prefix)
			pr.SetXForwarded()
		},
		Transport:     s.portTransport,
		FlushInterval: -1, // server-sent events and streamed bodies go out as they come
		ErrorHandler:  func(_ http.ResponseWriter, _ *http.Request, err error) { proxyErr = err },
		ErrorLog:      nil,
	}
	rp.ServeHTTP(w, r)
	if proxyErr != nil {
		return portError(proxyErr, port)
	}
	return nil
}

func portError(err error, port int) error {
	if errors.Is(err, network.ErrPortUnreachable) {
		return errorf(http.StatusBadGateway, apitype.CodePortUnreachable, "nothing listens on port %d in the lease", port)
	}
	if errors.Is(err, context.Canceled) {
		return err
	}
	return &Error{Status: http.StatusBadGateway, Code: apitype.CodePortUnreachable, Detail: fmt.Sprintf("port %d in the lease: the connection failed", port), Err: err}
}

// handlePortForward carries a TCP stream to the port inside the lease over a websocket:
// binary messages both ways, until either side ends.
func (s *Server) handlePortForward(w http.ResponseWriter, r *http.Request, _ principal) error {
	if !websocket.IsWebSocketUpgrade(r) {
		return badRequest("this route needs a websocket upgrade")
	}
	if !slices.Contains(websocketProtocols(r), apitype.PortForwardProtocol) {
		return badRequest("websocket subprotocol %s required", apitype.PortForwardProtocol)
	}
	id, port, err := s.leasePort(r)
	if err != nil {
		return err
	}
	c, err := s.opts.Network.DialPort(r.Context(), id, port)
	if err != nil {
		return portError(err, port)
	}
	defer c.Close()
	up := websocket.Upgrader{
		ReadBufferSize: wsBufferSize, WriteBufferSize: wsBufferSize,
		Subprotocols: []string{apitype.PortForwardProtocol},
		CheckOrigin:  func(r *http.Request) bool { return originAllowed(r, s.opts.AllowedOrigins) },
	}
	conn, err := up.Upgrade(w, r, nil)
	if err != nil {
		return nil // Upgrade has written the error response.
	}
	if !s.streams.add(conn.NetConn()) {
		_ = conn.Close()
		return nil
	}
	defer s.streams.remove(conn.NetConn())
	defer conn.Close()
	s.log.DebugContext(r.Context(), "port-forward", "lease", id, "port", port, "remote", r.RemoteAddr)
	lim := s.opts.Limits
	done := make(chan struct{})
	go func() { // the lease's bytes → the one websocket writer
		defer close(done)
		buf := make([]byte, 32<<10)
		ping := time.NewTicker(lim.WSPingInterval)
		defer ping.Stop()
		reads, quit := make(chan []byte), make(chan struct{})
		defer close(quit)
		go func() {
			defer close(reads)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					select {
					case reads <- append([]byte(nil), buf[:n]...):
					case <-quit:
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
		for {
			var err error
			select {
			case b, ok := <-reads:
				_ = conn.SetWriteDeadline(time.Now().Add(lim.WSWriteTimeout))
				if !ok {
					_ = conn.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, "the lease's end closed"))
					return
				}
				err = conn.WriteMessage(websocket.BinaryMessage, b)
			case <-ping.C:
				_ = conn.SetWriteDeadline(time.Now().Add(lim.WSWriteTimeout))
				err = conn.WriteMessage(websocket.PingMessage, nil)
			}
			if err != nil {
				_ = c.Close()
				return
			}
		}
	}()
	readWait := 2*lim.WSPingInterval + lim.WSWriteTimeout
	conn.SetPongHandler(func(string) error { return conn.SetReadDeadline(time.Now().Add(readWait)) })
	for {
		_ = conn.SetReadDeadline(time.Now().Add(readWait))
		kind, rd, err := conn.NextReader()
		if err != nil {
			break
		}
		if kind != websocket.BinaryMessage {
			continue
		}
		if _, err := io.Copy(c, rd); err != nil {
			break
		}
	}
	if tc, ok := c.(interface{ CloseWrite() error }); ok {
		_ = tc.CloseWrite()
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = c.Close()
		<-done
	}
	return nil
}
