// Package network gives each lease its egress and its ports. A lease's processes live in a
// network namespace of their own with only loopback (made by package sandbox); inside it
// this package listens on loopback for them: an HTTP proxy (HTTP_PROXY/HTTPS_PROXY point
// at it) and a DNS resolver (the lease's /etc/resolv.conf names it). Both decide by the
// lease's policy (lease/netpolicy), resolve names themselves and connect from the daemon to
// the address they checked, so a forged Host, SNI or DNS answer reaches nothing else. The
// daemon dials into the namespace to reach a lease's servers (DialPort).
package network

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sidecar-sandbox/sidecar/lease/netpolicy"
)

// Where a lease finds the daemon's services on its own loopback.
var (
	ProxyAddr = netip.MustParseAddrPort("127.0.0.1:3128")
	DNSAddr   = netip.MustParseAddrPort("127.0.0.1:53")
)

// LeaseEnv is what every process of a lease with a network of its own finds in its
// environment: the proxy that carries its egress. Programs that ignore these variables
// have no route out.
func LeaseEnv() []string {
	proxy := "http://" + ProxyAddr.String()
	noProxy := "localhost,127.0.0.1,::1"
	return []string{
		"HTTP_PROXY=" + proxy, "HTTPS_PROXY=" + proxy, "http_proxy=" + proxy, "https_proxy=" + proxy,
		"NO_PROXY=" + noProxy, "no_proxy=" + noProxy,
	}
}

// ResolvConf is a lease's /etc/resolv.conf: the resolver on its loopback.
var ResolvConf = "nameserver " + DNSAddr.Addr().String() + "\n"

// Defaults for zero Config fields.
const (
	DefaultMaxConnections = 256
	dialTimeout           = 10 * time.Second
)

// ErrUnknownLease is a lease this package holds no network for.
var ErrUnknownLease = errors.New("network: unknown lease")

// ErrPortUnreachable is a lease port nothing listens on.
var ErrPortUnreachable = errors.New("network: nothing listens on that port in the lease")

// Config configures a Manager.
type Config struct {
	Deny *netpolicy.Deny
	// MaxConnections bounds each lease's open outbound connections (0: the default).
	MaxConnections int
	// Resolver resolves names for leases; nil: the host's.
	Resolver *net.Resolver
	Logger   *slog.Logger
}

// Stats are one lease's traffic through the daemon since it was attached.
type Stats struct {
	BytesSent, BytesReceived        int64
	ConnectionsAllowed, Denied, Open int64
}

// Manager holds the network of every attached lease; safe for concurrent use.
type Manager struct {
	cfg    Config
	log    *slog.Logger
	mu     sync.Mutex
	leases map[string]*leaseNet
	total  counters // every lease's, detached ones included, for the metrics
}

type counters struct{ sent, received, allowed, denied, open atomic.Int64 }

func (c *counters) stats() Stats {
	return Stats{BytesSent: c.sent.Load(), BytesReceived: c.received.Load(),
		ConnectionsAllowed: c.allowed.Load(), Denied: c.denied.Load(), Open: c.open.Load()}
}

// Totals is the traffic of every lease since the Manager was made.
func (m *Manager) Totals() Stats { return m.total.stats() }

// New returns a Manager.
func New(cfg Config) *Manager {
	if cfg.MaxConnections == 0 {
		cfg.MaxConnections = DefaultMaxConnections
	}
	if cfg.Resolver == nil {
		cfg.Resolver = net.DefaultResolver
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Deny == nil {
		cfg.Deny = &netpolicy.Deny{HostAddrs: HostAddrs}
	}
	return &Manager{cfg: cfg, log: cfg.Logger, leases: map[string]*leaseNet{}}
}

// Check validates a policy against this daemon's deny set.
func (m *Manager) Check(p netpolicy.Policy) error {
	_, err := m.cfg.Deny.Compile(p)
	return err
}

// leaseNet is one lease's network: its namespace, policy, listeners and counters.
type leaseNet struct {
	id     string
	m      *Manager
	ns     *os.File
	log    *slog.Logger
	policy atomic.Pointer[netpolicy.Compiled]
	stats  counters
	closers []func() error
	conns   sync.Map // net.Conn → struct{}: closed on Detach
}

// Attach starts the lease's proxy and resolver inside its namespace ns (which the caller
// keeps open for as long as the lease is attached). Attaching a lease again replaces its
// policy only.
func (m *Manager) Attach(id string, ns *os.File, p netpolicy.Policy) error {
	cp, err := m.cfg.Deny.Compile(p)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if ln := m.leases[id]; ln != nil {
		ln.policy.Store(cp)
		return nil
	}
	ln := &leaseNet{id: id, m: m, ns: ns, log: m.log.With("lease", id)}
	ln.policy.Store(cp)
	if err := ln.listen(); err != nil {
		ln.close()
		return fmt.Errorf("network: lease %s: %w", id, err)
	}
	m.leases[id] = ln
	return nil
}

// SetPolicy replaces a lease's policy; it applies to connections opened from now on.
func (m *Manager) SetPolicy(id string, p netpolicy.Policy) error {
	cp, err := m.cfg.Deny.Compile(p)
	if err != nil {
		return err
	}
	ln, err := m.get(id)
	if err != nil {
		return err
	}
	ln.policy.Store(cp)
	return nil
}

// Stats reports a lease's traffic; ok is false for a lease not attached.
func (m *Manager) Stats(id string) (Stats, bool) {
	ln, err := m.get(id)
	if err != nil {
		return Stats{}, false
	}
	return ln.stats.stats(), true
}

// Detach stops the lease's listeners and cuts its open connections.
func (m *Manager) Detach(id string) {
	m.mu.Lock()
	ln := m.leases[id]
	delete(m.leases, id)
	m.mu.Unlock()
	if ln != nil {
		ln.close()
	}
}

// Close detaches every lease.
func (m *Manager) Close() {
	m.mu.Lock()
	ids := make([]string, 0, len(m.leases))
	for id := range m.leases {
		ids = append(ids, id)
	}
	m.mu.Unlock()
	for _, id := range ids {
		m.Detach(id)
	}
}

func (m *Manager) get(id string) (*leaseNet, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if ln := m.leases[id]; ln != nil {
		return ln, nil
	}
	return nil, fmt.Errorf("%w: %s", ErrUnknownLease, id)
}

// DialPort connects to port on the lease's loopback (a server bound to any of the lease's
// addresses listens there too).
func (m *Manager) DialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("network: port %d is not 1..65535", port)
	}
	ln, err := m.get(id)
	if err != nil {
		return nil, err
	}
	var c net.Conn
	err = InNetNS(ln.ns, func() error {
		var d net.Dialer
		c, err = d.DialContext(ctx, "tcp", netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), uint16(port)).String())
		return err
	})
	if errors.Is(err, errConnRefused) {
		return nil, fmt.Errorf("%w: %d", ErrPortUnreachable, port)
	}
	return c, err
}

func (ln *leaseNet) listen() error {
	return InNetNS(ln.ns, func() error {
		tcp, err := net.Listen("tcp", ProxyAddr.String())
		if err != nil {
			return fmt.Errorf("proxy on %s: %w", ProxyAddr, err)
		}
		ln.closers = append(ln.closers, tcp.Close)
		udp, err := net.ListenPacket("udp", DNSAddr.String())
		if err != nil {
			return fmt.Errorf("resolver on %s: %w", DNSAddr, err)
		}
		ln.closers = append(ln.closers, udp.Close)
		srv := ln.proxyServer()
		ln.closers = append(ln.closers, srv.Close)
		go func() { _ = srv.Serve(tcp) }()
		go ln.serveDNS(udp)
		return nil
	})
}

func (ln *leaseNet) close() {
	for i := len(ln.closers) - 1; i >= 0; i-- {
		_ = ln.closers[i]()
	}
	ln.conns.Range(func(c, _ any) bool {
		_ = c.(net.Conn).Close()
		return true
	})
}

// HostAddrs are the addresses of this host's interfaces (in the daemon's namespace).
func HostAddrs() []netip.Addr {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, p.Addr().Unmap())
		}
	}
	return out
}
