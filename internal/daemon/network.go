package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/sandbox"
	"github.com/sidecar-sandbox/sidecar/lease/netpolicy"
	"github.com/sidecar-sandbox/sidecar/lease/network"
)

// Network isolation modes (SIDECAR_NETWORK_ISOLATION).
const (
	NetworkNamespace = "namespace" // each lease in a network namespace of its own, egress by policy
	NetworkHost      = "host"      // leases share the host's network: no policy is enforced
)

// NetworkConfig is the lease network's part of the configuration.
type NetworkConfig struct {
	Isolation      string   `env:"SIDECAR_NETWORK_ISOLATION" envDefault:"namespace"`
	DefaultEgress  string   `env:"SIDECAR_NETWORK_DEFAULT" envDefault:"internet"`
	PrivateAllow   []string `env:"SIDECAR_NETWORK_PRIVATE_ALLOW" envSeparator:","`
	MaxConnections int      `env:"SIDECAR_NETWORK_MAX_CONNECTIONS" envDefault:"256"`
	// Resolver is the DNS server (host:port, UDP) the daemon asks for lease names;
	// "": the host's resolver.
	Resolver string `env:"SIDECAR_NETWORK_RESOLVER"`
}

// leaseNetwork is what the network configuration makes: the manager (nil on the host's
// network), the check and default a lease's policy gets, and what /v1/info says.
type leaseNetwork struct {
	manager *network.Manager
	check   func(netpolicy.Policy) error
	def     netpolicy.Policy
	info    apitype.NetworkInfo
}

// withDefaults fills zero fields (a Config built in code, as tests do) as the environment's
// defaults do.
func (c NetworkConfig) withDefaults() NetworkConfig {
	if c.Isolation == "" {
		c.Isolation = NetworkNamespace
	}
	if c.DefaultEgress == "" {
		c.DefaultEgress = netpolicy.EgressInternet
	}
	if c.MaxConnections == 0 {
		c.MaxConnections = network.DefaultMaxConnections
	}
	return c
}

func (c NetworkConfig) open(isolation string, caps sandbox.Caps, log *slog.Logger) (leaseNetwork, error) {
	c = c.withDefaults()
	ln := leaseNetwork{def: netpolicy.Policy{Egress: c.DefaultEgress}}
	if err := netpolicy.CheckSyntax(ln.def); err != nil {
		return ln, fmt.Errorf("SIDECAR_NETWORK_DEFAULT=%q: want none, allowlist or internet", c.DefaultEgress)
	}
	if c.MaxConnections < 1 {
		return ln, fmt.Errorf("SIDECAR_NETWORK_MAX_CONNECTIONS=%d: want 1 or more", c.MaxConnections)
	}
	deny := &netpolicy.Deny{HostAddrs: network.HostAddrs}
	for _, s := range c.PrivateAllow {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return ln, fmt.Errorf("SIDECAR_NETWORK_PRIVATE_ALLOW: %q is not a CIDR (10.20.0.0/16, say)", s)
		}
		deny.PrivateAllow = append(deny.PrivateAllow, p.Masked())
		ln.info.PrivateAllow = append(ln.info.PrivateAllow, p.Masked().String())
	}
	ln.info.DefaultEgress, ln.info.MaxConnections = c.DefaultEgress, c.MaxConnections
	switch {
	case c.Isolation != NetworkNamespace && c.Isolation != NetworkHost:
		return ln, fmt.Errorf("SIDECAR_NETWORK_ISOLATION=%q: want namespace or host", c.Isolation)
	case c.Isolation == NetworkHost || isolation == sandbox.IsolationNone:
		if isolation != sandbox.IsolationNone {
			log.Warn("LEASES SHARE THE HOST'S NETWORK: they reach each other's servers, the host's loopback services, the daemon's port, private ranges and the cloud metadata address; network policies other than none are refused", "setting", "SIDECAR_NETWORK_ISOLATION=host")
		}
		ln.info.Isolation = NetworkHost
		ln.check = hostNetworkCheck
		return ln, hostNetworkCheck(ln.def)
	case !caps.NetworkIsolation:
		return ln, fmt.Errorf("SIDECAR_NETWORK_ISOLATION=namespace needs network namespaces, which this host does not give the daemon (or set SIDECAR_NETWORK_ISOLATION=host)")
	}
	resolver, err := c.resolver()
	if err != nil {
		return ln, err
	}
	ln.manager = network.New(network.Config{
		Deny: deny, MaxConnections: c.MaxConnections, Resolver: resolver,
		Logger: log.With("component", "network"),
	})
	ln.check = ln.manager.Check
	ln.info.Isolation = NetworkNamespace
	ln.info.ProxyURL = "http://" + network.ProxyAddr.String()
	return ln, ln.check(ln.def)
}

func (c NetworkConfig) resolver() (*net.Resolver, error) {
	if c.Resolver == "" {
		return nil, nil
	}
	addr := c.Resolver
	if _, err := netip.ParseAddrPort(addr); err != nil {
		a, err2 := netip.ParseAddr(addr)
		if err2 != nil {
			return nil, fmt.Errorf("SIDECAR_NETWORK_RESOLVER=%q: want a DNS server's address (10.0.0.2 or 10.0.0.2:53)", c.Resolver)
		}
		addr = netip.AddrPortFrom(a, 53).String()
	}
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}}, nil
}

// hostNetworkCheck is the policy check when leases share the host's network: only what
// that gives (everything) or a loopback-only namespace (none) can be had.
func hostNetworkCheck(p netpolicy.Policy) error {
	if err := netpolicy.CheckSyntax(p); err != nil {
		return err
	}
	if p.Egress == netpolicy.EgressNone || (p.Egress == netpolicy.EgressInternet && len(p.AllowOut)+len(p.DenyOut) == 0) {
		return nil
	}
	return fmt.Errorf("%w: egress %q with rules needs leases in network namespaces of their own, and this daemon runs them on the host's network (SIDECAR_NETWORK_ISOLATION=host, or isolation none)", netpolicy.ErrInvalid, p.Egress)
}
