// Package client is the Go client of the sidecar daemon: the app and the worker import it
// to acquire leases, run processes and move files in them. It speaks the wire contract of
// package apitype and imports nothing of the daemon, so an importer pulls in no cgroups,
// pty, JavaScript engine or JWT code.
//
// A Client holds the shared token and acquires leases; a Lease is a handle on one lease,
// renewed in the background when it came from Acquire. Idempotent calls are retried on
// connection errors; error replies come back as *APIError matching the package's sentinel
// errors.
package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sidecar-sandbox/sidecar/tls/tlsconfig"
)

// Config says where the daemon is and how to prove who we are. Only URL is required; the
// zero value of everything else means "the system roots, no credential, no logging".
type Config struct {
	// URL of the daemon, https only, e.g. https://10.0.0.5:7443. A comma-separated list
	// names several sidecars (a fleet, see fleet.go): new leases are placed by capacity,
	// and each lease stays on its sidecar.
	URL string
	// Discovery "dns": URL's host is a name (a Kubernetes headless Service) and each
	// address it resolves to is a sidecar, spoken to with the name as TLS server name.
	// "" (default): URL is the one sidecar, or the list. Opt-in, since a name with several
	// addresses is as often one daemon (dual-stack localhost, a load balancer).
	Discovery string
	// LookupHost resolves the name for Discovery "dns"; nil: the system resolver.
	LookupHost func(ctx context.Context, host string) ([]string, error)
	// Token is the shared token (full access) or a lease token (that lease only).
	Token string
	// CAFile verifies the daemon's certificate; empty uses the system roots.
	CAFile string
	// CertFile and KeyFile present a client certificate (mTLS).
	CertFile, KeyFile string
	// HTTPClient replaces the client built from the TLS files, e.g. httptest's.
	// Websockets reuse its transport's TLS config and dialer when it is an *http.Transport.
	HTTPClient *http.Client
	// Logger receives retries and renewal failures; nil discards them.
	Logger *slog.Logger
	// WrapTransport, when set, wraps the HTTP transports the client builds from the TLS
	// files (tracing, metrics, a test validating every reply). Websockets do not pass
	// through it, and neither does an HTTPClient given above.
	WrapTransport func(http.RoundTripper) http.RoundTripper

	serverName string // a fleet member's TLS name when it is not the URL's host
}

// DiscoveryDNS is the Config.Discovery (SANDBOX_REMOTE_DISCOVERY) of a DNS fleet.
const DiscoveryDNS = "dns"

// Client talks to one daemon, or to several (a fleet). It is safe for concurrent use.
type Client struct {
	fleet *fleet // nil: one daemon, the fields below; else they are unset and the
	// members' clients do the talking
	base  *url.URL
	token string
	hc    *http.Client
	// bulk carries large bodies over HTTP/1.1, downloads and uploads: Go's HTTP/2 moved a
	// 64 MiB download at two thirds of HTTP/1.1's rate here even with the largest windows
	// it accepts, and an upload at half (BenchmarkUpload: each DATA frame is copied into
	// the stream's pipe and again out of it, a goroutine hand-off per frame). Bulk
	// transfers on their own connections also leave the shared HTTP/2 one to the small
	// requests, which would otherwise queue behind megabytes of DATA frames.
	bulk *http.Client
	// built: the transports New made, which CloseIdleConnections reaches even when
	// Config.WrapTransport hides them from http.Client's (which only forwards to a
	// transport with a CloseIdleConnections method).
	built  []*http.Transport
	ws     *websocket.Dialer
	log    *slog.Logger
	retry  retryPolicy
	reconn retryPolicy // websocket reattach
}

// Websocket buffers: gorilla's 4 KiB default halves attach throughput.
const wsBufferSize = 64 << 10

// New checks cfg and builds a Client. It does not contact the daemon.
// HTTP/2 flow control for bulk transfers: the largest windows Go accepts, 256 KiB frames.
const (
	h2Window    = 4<<20 - 1
	h2FrameSize = 256 << 10
)

func New(cfg Config) (*Client, error) {
	if cfg.Discovery != "" && cfg.Discovery != DiscoveryDNS {
		return nil, fmt.Errorf("client: discovery %q: want %q or none", cfg.Discovery, DiscoveryDNS)
	}
	if isFleet(cfg) {
		return newFleet(cfg)
	}
	base, err := parseBase(cfg.URL)
	if err != nil {
		return nil, err
	}
	c := &Client{
		base:   base,
		token:  cfg.Token,
		hc:     cfg.HTTPClient,
		log:    cfg.Logger,
		retry:  defaultRetry,
		reconn: defaultReattach,
	}
	if c.log == nil {
		c.log = discardLogger()
	}
	var tlsConf *tls.Config
	dialer := &websocket.Dialer{
		ReadBufferSize:   wsBufferSize,
		WriteBufferSize:  wsBufferSize,
		HandshakeTimeout: 30 * time.Second,
		Subprotocols:     []string{streamProtocolV5, streamProtocolV4},
		Proxy:            http.ProxyFromEnvironment,
	}
	if c.hc == nil {
		tlsConf, err = tlsconfig.Client(cfg.CAFile, cfg.CertFile, cfg.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("client: TLS: %w", err)
		}
		if cfg.serverName != "" {
			tlsConf.ServerName = cfg.serverName
		}
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.TLSClientConfig = tlsConf
		t.ForceAttemptHTTP2 = true
		t.MaxIdleConnsPerHost = 16
		// Go's HTTP/2 defaults (1 MiB receive windows, 16 KiB frames) make bulk
		// downloads pay a flow-control round trip every megabyte.
		t.HTTP2 = &http.HTTP2Config{
			MaxReceiveBufferPerConnection: h2Window,
			MaxReceiveBufferPerStream:     h2Window,
			MaxReadFrameSize:              h2FrameSize,
		}
		c.hc = &http.Client{Transport: t}
		b := t.Clone()
		b.ForceAttemptHTTP2 = false
		b.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{} // HTTP/1.1 only
		b.TLSClientConfig = tlsConf.Clone()
		b.TLSClientConfig.NextProtos = []string{"http/1.1"}
		c.bulk = &http.Client{Transport: b}
		c.built = []*http.Transport{t, b}
		if cfg.WrapTransport != nil {
			c.hc.Transport = cfg.WrapTransport(c.hc.Transport)
			c.bulk.Transport = cfg.WrapTransport(c.bulk.Transport)
		}
	} else if t, ok := c.hc.Transport.(*http.Transport); ok {
		tlsConf = t.TLSClientConfig
		dialer.NetDialContext = t.DialContext
		dialer.Proxy = t.Proxy
	}
	if tlsConf != nil {
		tlsConf = tlsConf.Clone()
	} else {
		tlsConf = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	// A websocket upgrade is an HTTP/1.1 affair: never let ALPN pick h2 for it.
	tlsConf.NextProtos = []string{"http/1.1"}
	dialer.TLSClientConfig = tlsConf
	c.ws = dialer
	return c, nil
}

// CloseIdleConnections closes the connections kept alive for reuse that carry no request
// now (both the HTTP/2 one and the HTTP/1.1 ones of bulk transfers). Requests still work
// afterwards: they dial again.
func (c *Client) CloseIdleConnections() {
	if c.fleet != nil {
		c.fleet.closeIdle()
		return
	}
	c.hc.CloseIdleConnections() // a caller's HTTPClient; ours are in built
	for _, t := range c.built {
		t.CloseIdleConnections()
	}
}

// parseBase checks one daemon URL.
func parseBase(raw string) (*url.URL, error) {
	base, err := url.Parse(strings.TrimRight(strings.TrimSpace(raw), "/"))
	if err != nil {
		return nil, fmt.Errorf("client: bad URL: %w", err)
	}
	if base.Scheme != "https" || base.Host == "" {
		return nil, errors.New("client: URL must be https://host[:port]")
	}
	return base, nil
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
