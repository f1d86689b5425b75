// Package sidecar is the daemon's HTTP server: routes in one place, the auth middleware,
// thin handlers (decode, call a package that knows nothing of HTTP, encode), websocket
// streams and metrics. It knows the parts it serves only by the small interfaces below;
// the daemon's wiring (opening, restoring and sweeping them) is package internal/daemon.
package sidecar

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/fsxfer"
	"github.com/sidecar-sandbox/sidecar/internal/process"
	"github.com/sidecar-sandbox/sidecar/internal/sandbox"
	"github.com/sidecar-sandbox/sidecar/internal/script"
	"github.com/sidecar-sandbox/sidecar/lease"
	"github.com/sidecar-sandbox/sidecar/lease/netpolicy"
	"github.com/sidecar-sandbox/sidecar/sidecar/console"
)

// HTTPLimits bounds what one connection or request may cost.
type HTTPLimits struct {
	MaxHeaderBytes    int           `env:"SIDECAR_MAX_HEADER_BYTES" envDefault:"32768"` // default 32 KiB: over it, 431
	MaxJSONBytes      int64         `env:"SIDECAR_MAX_BODY_BYTES" envDefault:"8388608"` // default 8 MiB: JSON bodies (exec stdin, script input)
	ReadHeaderTimeout time.Duration // default 10s: slowloris
	IdleTimeout       time.Duration // default 120s: idle keep-alives
	ShutdownTimeout   time.Duration // default 15s: in-flight requests get this long
	WSReadLimit       int64         // default 1 MiB: one websocket message from a client
	WSPingInterval    time.Duration // default 20s
	WSWriteTimeout    time.Duration // default 30s: a client that stops reading is cut off
}

func (l *HTTPLimits) setDefaults() {
	orDefault(&l.MaxHeaderBytes, 32<<10)
	orDefault(&l.MaxJSONBytes, 8<<20)
	orDefault(&l.WSReadLimit, 1<<20)
	orDefault(&l.ReadHeaderTimeout, 10*time.Second)
	orDefault(&l.IdleTimeout, 120*time.Second)
	orDefault(&l.ShutdownTimeout, 15*time.Second)
	orDefault(&l.WSPingInterval, 20*time.Second)
	orDefault(&l.WSWriteTimeout, 30*time.Second)
}

// orDefault sets *v to d unless it is positive.
func orDefault[T int | int64 | time.Duration](v *T, d T) {
	if *v <= 0 {
		*v = d
	}
}

// The parts the handlers serve, as small interfaces: internal/daemon passes the real
// ones, the handler tests fakes.

// Leases is the lease table (lease.Manager).
type Leases interface {
	Acquire(ctx context.Context, r lease.Request) (l lease.Lease, created bool, err error)
	Get(id string) (lease.Lease, error)
	List() []lease.Lease
	Retiring() int
	Spares() int
	Touch(id string)
	Renew(ctx context.Context, id string, ttl time.Duration) (lease.Lease, error)
	Release(ctx context.Context, id string) error
	SetNetwork(ctx context.Context, id string, p netpolicy.Policy) (lease.Lease, error)
}

// Processes runs lease processes (process.Manager).
type Processes interface {
	Exec(ctx context.Context, leaseID string, r process.ExecRequest) (process.ExecResult, error)
	Start(ctx context.Context, leaseID string, r process.StartRequest) (p *process.Process, created bool, err error)
	Get(leaseID, pid string) (*process.Process, error)
	List(leaseID string) []*process.Process
	Running(leaseID string) int
	Signal(leaseID, pid, name string) error
}

// Files opens a lease's confined filesystem.
type Files interface {
	FS(l lease.Lease) (*fsxfer.FS, error)
}

// Scripts runs scripts (script.Runner).
type Scripts interface {
	Run(ctx context.Context, req script.Request) (script.Result, error)
}

// Host is the machine side of the leases: the isolation it offers, a lease's live
// usage and leftover processes, and the sweep of what no lease accounts for.
type Host interface {
	Caps() sandbox.Caps
	Usage(ctx context.Context, l lease.Lease) *apitype.Usage
	// Leftovers lists what the lease's finished commands left running (at most
	// apitype.MaxLeftoversListed) and counts all of it.
	Leftovers(l lease.Lease) (listed []apitype.Leftover, count int)
	// SignalLeftover signals one leftover process of the lease, and nothing else
	// (sandbox.ErrNotLeftover).
	SignalLeftover(l lease.Lease, pid int, sig syscall.Signal) error
	Cleanup(ctx context.Context) (apitype.CleanupResult, error)
}

// Images is the operator's image store as the API shows it (lease/image). Errors wrap
// lease/image's sentinels.
type Images interface {
	List() apitype.ImageList
	// Pull starts a background pull and describes the image as it starts.
	Pull(name string) (apitype.ImageInfo, error)
	// Remove deletes the image from the store (image.ErrInUse while leases run on it).
	Remove(name string) error
	// Snapshot saves the lease's writable layer, workspace and home as a new image.
	Snapshot(ctx context.Context, l lease.Lease, name string) (apitype.ImageInfo, error)
}

// ServerOptions is what the HTTP server is built from.
type ServerOptions struct {
	Logger       *slog.Logger
	Version      string
	SharedTokens []string // the current shared token first, then a previous one
	Tokens       *lease.Tokens
	Leases       Leases
	Processes    Processes
	Shells       Shells // nil: shell sessions disabled
	Files        Files
	Host         Host
	Scripts      Scripts // nil: scripts disabled
	Network      Network // nil: leases share the host's network
	Images       Images  // nil: no images (GET /v1/images lists none)
	// LeaseMetrics counts the lease table's events (its OnEvent feeds it); nil: the
	// server's own, which nothing feeds.
	LeaseMetrics   *LeaseMetrics
	AllowedOrigins []string
	Limits         HTTPLimits
	Info           apitype.Info // static parts of GET /v1/info
	CertNotAfter   func() time.Time
	Now            func() time.Time // the lease clock; default time.Now
	// HostPaths are redacted from error details (work root, state dir).
	HostPaths []string
	// CapacityMemoryBytes is the memory leases may commit in all, for the capacity GET
	// /v1/info reports (0: none counted).
	CapacityMemoryBytes int64
	// Console serves the operator console at /ui/ and takes its session cookie on the
	// API routes (SIDECAR_CONSOLE); off: /ui/ is 404 and no cookie is looked at.
	Console bool
}

// Server serves the v1 API over TLS.
type Server struct {
	opts    ServerOptions
	log     *slog.Logger
	auth    *authenticator
	mux     *http.ServeMux
	metrics *metrics
	http    *http.Server
	ln      net.Listener

	streams streamSet // hijacked websocket connections, closed on shutdown

	// stopping ends long-lived plain HTTP streams (watches) at Shutdown, which would
	// otherwise wait for them until its deadline.
	stopping context.Context
	stop     context.CancelFunc
	// patterns are the routes as registered, for the OpenAPI contract test.
	patterns []string
	// console serves /ui/ and its sessions; nil when ServerOptions.Console is off.
	console *console.Console
	// usage is each lease's recent usage samples (usage.go).
	usage usageHistory
	// draining refuses new leases (drain.go).
	draining atomic.Bool
	// portTransport carries the ports route's requests into leases (nil without Network).
	portTransport *http.Transport
}

// NewServer builds the server and its routes; Listen and Serve start it.
func NewServer(opts ServerOptions) *Server {
	opts.Limits.setDefaults()
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	s := &Server{
		opts: opts,
		log:  opts.Logger,
		auth: newAuthenticator(opts.SharedTokens, opts.Tokens, opts.Leases),
		mux:  http.NewServeMux(),
	}
	s.stopping, s.stop = context.WithCancel(context.Background())
	if opts.Network != nil {
		s.portTransport = newPortTransport(opts.Network)
	}
	if opts.Console {
		s.console = console.New(s.auth.isShared, s.auditSignIn, opts.Now)
	}
	s.metrics = newMetrics(s)
	s.routes()
	s.http = &http.Server{
		Handler:           s,
		ReadHeaderTimeout: opts.Limits.ReadHeaderTimeout,
		IdleTimeout:       opts.Limits.IdleTimeout,
		MaxHeaderBytes:    opts.Limits.MaxHeaderBytes,
		// Go's HTTP/2 defaults (1 MiB receive windows, 16 KiB frames) make bulk uploads
		// pay a flow-control round trip every megabyte; these are the largest it takes.
		HTTP2: &http.HTTP2Config{
			MaxReceiveBufferPerConnection: 4<<20 - 1,
			MaxReceiveBufferPerStream:     4<<20 - 1,
			MaxReadFrameSize:              256 << 10,
		},
		ErrorLog: slog.NewLogLogger(opts.Logger.Handler(), slog.LevelDebug),
	}
	return s
}

func (s *Server) now() time.Time { return s.opts.Now() }

// ServeHTTP routes the request (tests may drive the server without a listener).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	keepAbsolutePath(r)
	s.mux.ServeHTTP(w, r)
}

// pathRoutes are the routes of /v1/leases/{id}/<name>/{path...}.
var pathRoutes = map[string]bool{"files": true, "archive": true, "find": true, "grep": true, "stat": true, "watch": true}

// keepAbsolutePath keeps an absolute workdir path (/workspace/a.txt) in a path route:
// …/files//workspace/a.txt has a doubled slash, which ServeMux would "clean" by a
// redirect to …/files/workspace/a.txt, a relative path naming another file. Escaping
// that one slash (%2F, which the route's {path...} decodes back) keeps the path as sent.
func keepAbsolutePath(r *http.Request) {
	p := r.URL.EscapedPath()
	rest, ok := strings.CutPrefix(p, apitype.RouteLeases+"/")
	if !ok {
		return
	}
	id, rest, ok := strings.Cut(rest, "/")
	if !ok || id == "" {
		return
	}
	name, tail, ok := strings.Cut(rest, "/")
	if !ok || !pathRoutes[name] || !strings.HasPrefix(tail, "/") {
		return
	}
	r.URL.RawPath = p[:len(p)-len(tail)] + "%2F" + tail[1:]
}

// Listen opens the TLS listener; Serve serves on it. They are separate so that a caller
// knows the address (port 0 in tests) and that the port is bound before it says READY.
func (s *Server) Listen(addr string, cfg *tls.Config) error {
	if cfg == nil {
		return errors.New("sidecar: TLS configuration required: there is no plain-HTTP mode")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	s.http.TLSConfig = cfg
	s.ln = ln
	return nil
}

// Addr is the listening address, once Listen has returned.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Serve serves until Shutdown; it returns nil after a clean shutdown.
func (s *Server) Serve() error {
	// ServeTLS (not Serve on a tls listener) so that HTTP/2 is configured.
	err := s.http.ServeTLS(s.ln, "", "")
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Shutdown stops accepting, lets in-flight requests finish within the deadline, cuts
// websocket streams (their background processes keep running) and returns.
func (s *Server) Shutdown(ctx context.Context) error {
	s.stop()
	err := s.http.Shutdown(ctx)
	s.streams.closeAll()
	if errors.Is(err, context.DeadlineExceeded) {
		_ = s.http.Close()
	}
	return err
}

// handlerFunc is a handler that returns its error; route writes it as problem+json.
type handlerFunc func(w http.ResponseWriter, r *http.Request, p principal) error

// route registers one route: origin policy, authentication, metrics and error writing
// happen here and nowhere else.
func (s *Server) route(pattern string, need access, h handlerFunc) {
	s.patterns = append(s.patterns, pattern)
	_, path, _ := strings.Cut(pattern, " ")
	s.mux.Handle(pattern, s.metrics.instrument(path, func(w *responseWriter, r *http.Request) {
		if !s.originAllowed(r) {
			s.writeError(w, r, forbidden("origin not allowed"))
			return
		}
		p, err := s.authenticate(w, r, need)
		if err != nil {
			s.metrics.authFailures.Inc()
			s.log.WarnContext(r.Context(), "auth failed", "audit", true, "remote", r.RemoteAddr, "method", r.Method, "path", r.URL.Path, "reason", err.Error())
			s.writeError(w, r, err)
			return
		}
		s.refreshToken(w, r, p)
		if err := h(w, r, p); err != nil {
			if w.wroteHeader {
				// Too late for a problem body: the status line went out. Abort the
				// response so the client sees a cut stream, never a short one that
				// looks complete.
				s.log.WarnContext(r.Context(), "request failed after response started", "path", r.URL.Path, "err", err)
				panic(http.ErrAbortHandler)
			}
			s.writeError(w, r, err)
		}
	}))
}

// refreshToken hands a lease-token caller a fresh token when the owner has renewed the
// lease past the token's expiry, so a worker that holds only the token keeps working.
// Websocket upgrades do not carry it (the upgrader writes its own headers); the next
// plain request does.
func (s *Server) refreshToken(w http.ResponseWriter, r *http.Request, p principal) {
	if !p.stale {
		return
	}
	l, err := s.opts.Leases.Get(p.leaseID)
	if err != nil {
		return
	}
	tok, err := s.opts.Tokens.Issue(l)
	if err != nil {
		s.log.WarnContext(r.Context(), "refreshing a lease token failed", "lease", l.ID, "err", err)
		return
	}
	w.Header().Set(apitype.HeaderLeaseToken, tok)
}

func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	writeError(w, r, s.log, s.redact, err)
}

// redact hides host paths in error details: a client learns the reason, not the layout.
func (s *Server) redact(detail string) string {
	for _, p := range s.opts.HostPaths {
		if p != "" && p != "/" {
			detail = strings.ReplaceAll(detail, p, "…")
		}
	}
	return detail
}

// decodeJSON reads a bounded JSON body into v, refusing unknown fields and trailing data.
func (s *Server) decodeJSON(w http.ResponseWriter, r *http.Request, v any) error {
	if ct := r.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(ct, "application/json") {
		return badRequest("Content-Type must be application/json")
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, s.opts.Limits.MaxJSONBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			return err
		}
		if errors.Is(err, io.EOF) && r.ContentLength <= 0 {
			return nil // an empty body is an empty object
		}
		return badRequest("invalid JSON body: %v", err)
	}
	if dec.More() {
		return badRequest("invalid JSON body: trailing data")
	}
	return nil
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	return json.NewEncoder(w).Encode(v)
}

// responseWriter records the status for metrics and whether the header went out, and
// keeps Hijack and Flush reachable for websockets and streaming.
type responseWriter struct {
	http.ResponseWriter
	status      int
	bytes       int64
	wroteHeader bool
}

func (w *responseWriter) WriteHeader(code int) {
	if !w.wroteHeader {
		w.status, w.wroteHeader = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *responseWriter) Write(b []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)
	return n, err
}

func (w *responseWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *responseWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	h, ok := w.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, fmt.Errorf("connection cannot be hijacked (HTTP/2?)")
	}
	w.status, w.wroteHeader = http.StatusSwitchingProtocols, true
	return h.Hijack()
}

func (w *responseWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// streamSet tracks hijacked connections so Shutdown can close them.
type streamSet struct {
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

func (ss *streamSet) add(c net.Conn) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.closed {
		return false
	}
	if ss.conns == nil {
		ss.conns = map[net.Conn]struct{}{}
	}
	ss.conns[c] = struct{}{}
	return true
}

func (ss *streamSet) remove(c net.Conn) {
	ss.mu.Lock()
	delete(ss.conns, c)
	ss.mu.Unlock()
}

func (ss *streamSet) closeAll() {
	ss.mu.Lock()
	ss.closed = true
	conns := ss.conns
	ss.conns = nil
	ss.mu.Unlock()
	for c := range conns {
		_ = c.Close()
	}
}
