package netpolicy

import (
	"fmt"
	"net/netip"
	"strings"
)

// A denied destination's rule names what refused it; logs, metrics and the proxy's 403 say it.
const (
	RuleEgressNone = "egress none"
	RuleNotAllowed = "not in allow_out"
	RulePort25     = "deny set: port 25"
)

// reserved are ranges no policy and no operator setting opens: this host, its loopback
// and every multicast or reserved block. The host's own addresses are added by Host.
var reserved = prefixes(map[string]string{
	"0.0.0.0/8":          "this network",
	"127.0.0.0/8":        "loopback",
	"::1/128":            "loopback",
	"::/128":             "unspecified",
	"224.0.0.0/4":        "multicast",
	"ff00::/8":           "multicast",
	"240.0.0.0/4":        "reserved",
	"255.255.255.255/32": "broadcast",
})

// private are ranges closed by default that the operator may open
// (SIDECAR_NETWORK_PRIVATE_ALLOW) for a lease's allow_out to name.
var private = prefixes(map[string]string{
	"10.0.0.0/8":     "private (RFC 1918)",
	"172.16.0.0/12":  "private (RFC 1918)",
	"192.168.0.0/16": "private (RFC 1918)",
	"100.64.0.0/10":  "shared address space (RFC 6598)",
	"169.254.0.0/16": "link-local (cloud metadata)",
	"fe80::/10":      "link-local",
	"fc00::/7":       "unique local (ULA)",
	"192.0.0.0/24":   "IETF protocol assignments",
	"198.18.0.0/15":  "benchmarking",
	"64:ff9b::/96":   "NAT64 (embeds IPv4)",
	"64:ff9b:1::/48": "NAT64 (embeds IPv4)",
	"2002::/16":      "6to4 (embeds IPv4)",
})

type namedPrefix struct {
	netip.Prefix
	name string
}

func prefixes(m map[string]string) []namedPrefix {
	var ps []namedPrefix
	for s, name := range m {
		ps = append(ps, namedPrefix{netip.MustParsePrefix(s), name})
	}
	return ps
}

// Deny is the deny set of one daemon: reserved ranges, the host's own addresses (HostAddrs,
// called at each decision so that addresses added later count) and the private ranges,
// of which the operator's PrivateAllow opens parts.
type Deny struct {
	HostAddrs    func() []netip.Addr
	PrivateAllow []netip.Prefix
}

// denied says why addr:port is in the deny set ("" when it is not), and whether the
// operator opened it for allow_out to name (only private ranges can be).
func (d *Deny) denied(addr netip.Addr, port int) (reason string, openable bool) {
	if port == 25 {
		return RulePort25, false
	}
	addr = addr.Unmap()
	for _, p := range reserved {
		if p.Contains(addr) {
			return "deny set: " + p.name, false
		}
	}
	if d.HostAddrs != nil {
		for _, a := range d.HostAddrs() {
			if a.Unmap() == addr {
				return "deny set: this host's address", false
			}
		}
	}
	for _, p := range private {
		if p.Contains(addr) {
			for _, open := range d.PrivateAllow {
				if open.Contains(addr) {
					return "deny set: " + p.name, true
				}
			}
			return "deny set: " + p.name, false
		}
	}
	return "", false
}

// Compiled is a validated policy, ready to decide.
type Compiled struct {
	Policy
	allow, deny []Rule
}

// Compile checks p against the deny set: an allow_out entry inside a private range must lie
// in the operator's PrivateAllow, and one inside a reserved range is refused.
func (d *Deny) Compile(p Policy) (*Compiled, error) {
	switch p.Egress {
	case EgressNone, EgressAllowlist, EgressInternet:
	case "host":
		return nil, fmt.Errorf("%w: network %q is not a lease's choice: the host's network is an operator setting (SIDECAR_NETWORK_ISOLATION=host); ask for {\"egress\":\"internet\"}", ErrInvalid, p.Egress)
	default:
		return nil, fmt.Errorf("%w: egress %q is none of %q, %q, %q", ErrInvalid, p.Egress, EgressNone, EgressAllowlist, EgressInternet)
	}
	if len(p.AllowOut) > MaxRules || len(p.DenyOut) > MaxRules {
		return nil, fmt.Errorf("%w: at most %d entries in allow_out and in deny_out", ErrInvalid, MaxRules)
	}
	if p.Egress == EgressNone && len(p.AllowOut) > 0 {
		return nil, fmt.Errorf("%w: allow_out with egress %q: nothing can be allowed (use egress %q)", ErrInvalid, EgressNone, EgressAllowlist)
	}
	c := &Compiled{Policy: p}
	for _, s := range p.AllowOut {
		r, err := ParseRule(s)
		if err != nil {
			return nil, err
		}
		if err := d.checkAllow(r); err != nil {
			return nil, err
		}
		c.allow = append(c.allow, r)
	}
	for _, s := range p.DenyOut {
		r, err := ParseRule(s)
		if err != nil {
			return nil, err
		}
		c.deny = append(c.deny, r)
	}
	return c, nil
}

// checkAllow refuses an allow_out address rule that reaches into the deny set further than
// the operator opened it.
func (d *Deny) checkAllow(r Rule) error {
	if !r.Prefix.IsValid() {
		return nil
	}
	for _, p := range reserved {
		if p.Overlaps(r.Prefix) && r.Prefix.Bits() >= p.Bits() {
			return fmt.Errorf("%w: allow_out %q is in the deny set (%s), which no policy opens", ErrInvalid, r.Text, p.name)
		}
	}
	for _, p := range private {
		if !p.Overlaps(r.Prefix) || r.Prefix.Bits() < p.Bits() {
			continue // a wider rule (0.0.0.0/0) still leaves the deny set closed
		}
		if !covered(r.Prefix, d.PrivateAllow) {
			return fmt.Errorf("%w: allow_out %q is in the deny set (%s): the operator opens private ranges with SIDECAR_NETWORK_PRIVATE_ALLOW", ErrInvalid, r.Text, p.name)
		}
	}
	return nil
}

func covered(p netip.Prefix, by []netip.Prefix) bool {
	for _, b := range by {
		if b.Bits() <= p.Bits() && b.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

// Verdict is one decision: Rule names what refused (or, when allowed, what allowed) it.
type Verdict struct {
	Allowed bool
	Rule    string
}

// AllowsName is the decision on a name before it is resolved (DNS answers and the proxy's
// first check): false when no address it could resolve to would be allowed by name.
func (c *Compiled) AllowsName(host string, port int) Verdict {
	host = normalizeHost(host)
	switch {
	case c.Egress == EgressNone:
		return Verdict{false, RuleEgressNone}
	case port == 25:
		return Verdict{false, RulePort25}
	}
	for _, r := range c.allow {
		if r.matches(host, netip.Addr{}, port) {
			return Verdict{true, "allow_out " + r.Text}
		}
	}
	for _, r := range c.deny {
		if r.Domain != "" && r.matches(host, netip.Addr{}, port) {
			return Verdict{false, "deny_out " + r.Text}
		}
	}
	if c.Egress == EgressAllowlist && !c.allowsSomeAddress() {
		return Verdict{false, RuleNotAllowed}
	}
	return Verdict{true, "egress " + c.Egress}
}

func (c *Compiled) allowsSomeAddress() bool {
	for _, r := range c.allow {
		if r.Prefix.IsValid() {
			return true
		}
	}
	return false
}

// Allows is the decision on one connection: to addr:port, reached by the name host ("" for
// an address the lease named itself; port 0: any). The deny set comes first, then allow_out (which wins
// over deny_out, as in E2B's API), then deny_out, then the egress mode.
func (c *Compiled) Allows(d *Deny, host string, addr netip.Addr, port int) Verdict {
	if c.Egress == EgressNone {
		return Verdict{false, RuleEgressNone}
	}
	host, addr = normalizeHost(host), addr.Unmap()
	reason, openable := d.denied(addr, port)
	allowRule := ""
	for _, r := range c.allow {
		if r.matches(host, addr, port) {
			allowRule = "allow_out " + r.Text
			break
		}
	}
	if reason != "" {
		// Only an address rule opens a private range: a name that resolves into one is
		// refused whatever the name (no DNS rebinding into the operator's network).
		if rule, ok := c.allowedAddress(d, addr, port); openable && ok {
			return Verdict{true, rule}
		}
		return Verdict{false, reason}
	}
	if allowRule != "" {
		return Verdict{true, allowRule}
	}
	for _, r := range c.deny {
		if r.matches(host, addr, port) {
			return Verdict{false, "deny_out " + r.Text}
		}
	}
	if c.Egress == EgressAllowlist {
		return Verdict{false, RuleNotAllowed}
	}
	return Verdict{true, "egress internet"}
}

// allowedAddress finds the allow_out address rule that names addr:port inside what the
// operator opened (a wider rule, such as 0.0.0.0/0, opens no private range).
func (c *Compiled) allowedAddress(d *Deny, addr netip.Addr, port int) (string, bool) {
	for _, r := range c.allow {
		if r.Prefix.IsValid() && r.matches("", addr, port) && covered(r.Prefix, d.PrivateAllow) {
			return "allow_out " + r.Text, true
		}
	}
	return "", false
}

func normalizeHost(h string) string { return strings.ToLower(strings.TrimSuffix(h, ".")) }

// CheckSyntax checks p's mode and entries, without the deny set: for a policy a daemon
// accepted earlier, whose operator settings are not at hand.
func CheckSyntax(p Policy) error {
	_, err := (&Deny{PrivateAllow: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}}).Compile(p)
	return err
}
