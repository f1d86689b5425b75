// Package netpolicy decides where a lease's outbound connections may go. A lease asks for
// a Policy (no egress, an allow-list, or the internet, refined by allow_out and deny_out
// rules); the operator's deny set applies under every policy and no lease request can open
// it. The package is pure: it parses, validates and matches; lease/network enforces.
package netpolicy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Egress modes.
const (
	EgressNone      = "none"      // nothing leaves the lease
	EgressAllowlist = "allowlist" // only what allow_out names
	EgressInternet  = "internet"  // everything but deny_out and the deny set
)

// Limits on a policy's size.
const (
	MaxRules      = 256 // entries in allow_out, and in deny_out
	MaxDomainName = 253
)

// ErrInvalid is a policy a lease may not have; the message names the entry and, where an
// operator setting would allow it, that setting.
var ErrInvalid = errors.New("invalid network policy")

// Policy is what a lease asks for: the acquire body's "network" and the body of
// PUT /v1/leases/{id}/network.
type Policy struct {
	Egress   string   `json:"egress"`
	AllowOut []string `json:"allow_out,omitempty"`
	DenyOut  []string `json:"deny_out,omitempty"`
}

// UnmarshalJSON also takes the string form: "none" (no egress), and the three egress
// modes by name, so that `"network":"none"` keeps working.
func (p *Policy) UnmarshalJSON(b []byte) error {
	if b = bytes.TrimSpace(b); len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*p = Policy{Egress: s}
		return nil
	}
	type plain Policy
	return json.Unmarshal(b, (*plain)(p))
}

// IsZero reports an absent policy (the operator's default applies).
func (p Policy) IsZero() bool { return p.Egress == "" && p.AllowOut == nil && p.DenyOut == nil }

// Rule is one allow_out or deny_out entry: an address range or a domain name (exact, or
// "*." for every name below one), with a port or 0 for every port.
type Rule struct {
	Text   string
	Prefix netip.Prefix // valid for an address rule
	Domain string       // lower case, without the "*." of a wildcard
	Wild   bool
	Port   int
}

// ParseRule reads "203.0.113.7", "203.0.113.0/24", "[2001:db8::/32]:443", "example.com",
// "*.example.com:443" and the like.
func ParseRule(s string) (Rule, error) {
	r := Rule{Text: s}
	host := s
	if strings.HasPrefix(s, "[") {
		end := strings.Index(s, "]")
		if end < 0 {
			return r, fmt.Errorf("%w: %q: no closing ]", ErrInvalid, s)
		}
		host = s[1:end]
		if rest := s[end+1:]; rest != "" {
			if !strings.HasPrefix(rest, ":") {
				return r, fmt.Errorf("%w: %q: want [address]:port", ErrInvalid, s)
			}
			p, err := parsePort(rest[1:])
			if err != nil {
				return r, fmt.Errorf("%w: %q: %v", ErrInvalid, s, err)
			}
			r.Port = p
		}
	} else if strings.Count(s, ":") == 1 {
		h, port, _ := strings.Cut(s, ":")
		p, err := parsePort(port)
		if err != nil {
			return r, fmt.Errorf("%w: %q: %v", ErrInvalid, s, err)
		}
		host, r.Port = h, p
	}
	if pfx, err := parsePrefix(host); err == nil {
		r.Prefix = pfx
		return r, nil
	}
	if strings.ContainsAny(host, ":/") {
		return r, fmt.Errorf("%w: %q is neither an address, a CIDR nor a domain name (an IPv6 address with a port is written [address]:port)", ErrInvalid, s)
	}
	name := strings.ToLower(strings.TrimSuffix(host, "."))
	if rest, ok := strings.CutPrefix(name, "*."); ok {
		name, r.Wild = rest, true
	}
	if !validDomain(name) {
		return r, fmt.Errorf("%w: %q is not a domain name (a wildcard is \"*.example.com\")", ErrInvalid, s)
	}
	r.Domain = name
	return r, nil
}

func parsePort(s string) (int, error) {
	p, err := strconv.Atoi(s)
	if err != nil || p < 1 || p > 65535 {
		return 0, fmt.Errorf("port %q is not 1..65535", s)
	}
	return p, nil
}

func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return p, err
		}
		if p.Addr().Is4In6() {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	a = a.Unmap().WithZone("")
	return netip.PrefixFrom(a, a.BitLen()), nil
}

func validDomain(name string) bool {
	if name == "" || len(name) > MaxDomainName {
		return false
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// matchName reports whether the rule names host (lower case, no trailing dot).
func (r Rule) matchName(host string) bool {
	if r.Domain == "" || host == "" {
		return false
	}
	if r.Wild {
		return strings.HasSuffix(host, "."+r.Domain)
	}
	return host == r.Domain
}

func (r Rule) matches(host string, addr netip.Addr, port int) bool {
	if r.Port != 0 && port > 0 && r.Port != port {
		return false
	}
	if r.Prefix.IsValid() {
		return addr.IsValid() && r.Prefix.Contains(addr)
	}
	return r.matchName(host)
}
