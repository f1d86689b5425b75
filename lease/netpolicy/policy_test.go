package netpolicy

import (
	"encoding/json"
	"errors"
	"net/netip"
	"strings"
	"testing"
)

var hostAddr = netip.MustParseAddr("198.51.100.1")

func testDeny(privateAllow ...string) *Deny {
	d := &Deny{HostAddrs: func() []netip.Addr { return []netip.Addr{hostAddr} }}
	for _, s := range privateAllow {
		d.PrivateAllow = append(d.PrivateAllow, netip.MustParsePrefix(s))
	}
	return d
}

func TestPolicyJSONTakesStringAndObject(t *testing.T) {
	for in, want := range map[string]Policy{
		`"none"`: {Egress: EgressNone},
		`{"egress":"allowlist","allow_out":["example.com"]}`: {Egress: EgressAllowlist, AllowOut: []string{"example.com"}},
	} {
		var p Policy
		if err := json.Unmarshal([]byte(in), &p); err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		if p.Egress != want.Egress || len(p.AllowOut) != len(want.AllowOut) {
			t.Errorf("%s: got %+v, want %+v", in, p, want)
		}
	}
}

func TestParseRule(t *testing.T) {
	for _, c := range []struct {
		in     string
		prefix string
		domain string
		wild   bool
		port   int
	}{
		{in: "203.0.113.7", prefix: "203.0.113.7/32"},
		{in: "203.0.113.0/24:443", prefix: "203.0.113.0/24", port: 443},
		{in: "[2001:db8::/32]:8080", prefix: "2001:db8::/32", port: 8080},
		{in: "2001:db8::1", prefix: "2001:db8::1/128"},
		{in: "::ffff:203.0.113.9", prefix: "203.0.113.9/32"},
		{in: "Example.COM.", domain: "example.com"},
		{in: "*.pypi.org:443", domain: "pypi.org", wild: true, port: 443},
	} {
		r, err := ParseRule(c.in)
		if err != nil {
			t.Fatalf("%s: %v", c.in, err)
		}
		if (c.prefix != "" && r.Prefix.String() != c.prefix) || r.Domain != c.domain || r.Wild != c.wild || r.Port != c.port {
			t.Errorf("%s: got %+v", c.in, r)
		}
	}
	for _, bad := range []string{"", "a..b", "-x.com", "1.2.3.4:0", "1.2.3.4:70000", "[::1", "2001:db8::1:99999/3", "ex ample.com", "*.", "http://x.com"} {
		if _, err := ParseRule(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("%q: err %v, want ErrInvalid", bad, err)
		}
	}
}

func TestCompileRefusesWhatOnlyTheOperatorOpens(t *testing.T) {
	d := testDeny("10.20.0.0/16")
	for _, c := range []struct {
		p    Policy
		want string // "" for accepted, else a fragment of the error
	}{
		{Policy{Egress: EgressAllowlist, AllowOut: []string{"10.20.1.0/24"}}, ""},
		{Policy{Egress: EgressAllowlist, AllowOut: []string{"10.21.0.1"}}, "SIDECAR_NETWORK_PRIVATE_ALLOW"},
		{Policy{Egress: EgressAllowlist, AllowOut: []string{"169.254.169.254"}}, "SIDECAR_NETWORK_PRIVATE_ALLOW"},
		{Policy{Egress: EgressAllowlist, AllowOut: []string{"127.0.0.1:5432"}}, "no policy opens"},
		{Policy{Egress: EgressAllowlist, AllowOut: []string{"0.0.0.0/0"}}, ""},
		{Policy{Egress: "host"}, "SIDECAR_NETWORK_ISOLATION"},
		{Policy{Egress: "everything"}, "none of"},
		{Policy{Egress: EgressNone, AllowOut: []string{"example.com"}}, "nothing can be allowed"},
		{Policy{Egress: EgressInternet, DenyOut: make([]string, MaxRules+1)}, "at most"},
	} {
		_, err := d.Compile(c.p)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v: %v", c.p, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%+v: err %v, want one saying %q", c.p, err, c.want)
		}
	}
}

func TestAllows(t *testing.T) {
	d := testDeny("10.20.0.0/16")
	public := netip.MustParseAddr("198.51.100.5")
	neighbour := netip.MustParseAddr("198.51.100.6")
	for _, c := range []struct {
		name string
		p    Policy
		host string
		addr netip.Addr
		port int
		want bool
	}{
		{"internet reaches a public address", Policy{Egress: EgressInternet}, "", public, 443, true},
		{"internet: loopback is denied", Policy{Egress: EgressInternet}, "", netip.MustParseAddr("127.0.0.1"), 80, false},
		{"internet: the host's own address is denied", Policy{Egress: EgressInternet}, "", hostAddr, 7443, false},
		{"internet: metadata is denied", Policy{Egress: EgressInternet}, "", netip.MustParseAddr("169.254.169.254"), 80, false},
		{"internet: RFC 1918 is denied", Policy{Egress: EgressInternet}, "", netip.MustParseAddr("10.0.0.1"), 80, false},
		{"internet: mapped loopback is denied", Policy{Egress: EgressInternet}, "", netip.MustParseAddr("::ffff:127.0.0.1"), 80, false},
		{"internet: ULA is denied", Policy{Egress: EgressInternet}, "", netip.MustParseAddr("fd00::1"), 80, false},
		{"internet: port 25 is denied", Policy{Egress: EgressInternet}, "", public, 25, false},
		{"internet: deny_out wins over the mode", Policy{Egress: EgressInternet, DenyOut: []string{"198.51.100.0/24"}}, "", public, 80, false},
		{"allow_out wins over deny_out", Policy{Egress: EgressInternet, AllowOut: []string{"198.51.100.5"}, DenyOut: []string{"0.0.0.0/0"}}, "", public, 80, true},
		{"allowlist names the host", Policy{Egress: EgressAllowlist, AllowOut: []string{"198.51.100.5"}}, "", public, 80, true},
		{"allowlist refuses the neighbour", Policy{Egress: EgressAllowlist, AllowOut: []string{"198.51.100.5"}}, "", neighbour, 80, false},
		{"allowlist port rule", Policy{Egress: EgressAllowlist, AllowOut: []string{"198.51.100.5:443"}}, "", public, 80, false},
		{"allowlist by name", Policy{Egress: EgressAllowlist, AllowOut: []string{"pkg.example"}}, "PKG.example.", public, 443, true},
		{"allowlist wildcard covers a subdomain", Policy{Egress: EgressAllowlist, AllowOut: []string{"*.example"}}, "a.b.example", public, 443, true},
		{"allowlist wildcard is not the apex", Policy{Egress: EgressAllowlist, AllowOut: []string{"*.example"}}, "example", public, 443, false},
		{"a name never opens the deny set", Policy{Egress: EgressAllowlist, AllowOut: []string{"pkg.example"}}, "pkg.example", netip.MustParseAddr("10.20.0.5"), 443, false},
		{"private range: operator and lease both open it", Policy{Egress: EgressAllowlist, AllowOut: []string{"10.20.0.5"}}, "", netip.MustParseAddr("10.20.0.5"), 80, true},
		{"private range: the lease alone cannot", Policy{Egress: EgressInternet}, "", netip.MustParseAddr("10.20.0.5"), 80, false},
		{"0.0.0.0/0 does not open the deny set", Policy{Egress: EgressAllowlist, AllowOut: []string{"0.0.0.0/0"}}, "", netip.MustParseAddr("10.20.0.5"), 80, false},
		{"none reaches nothing", Policy{Egress: EgressNone}, "", public, 443, false},
	} {
		cp, err := d.Compile(c.p)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if v := cp.Allows(d, c.host, c.addr, c.port); v.Allowed != c.want || v.Rule == "" {
			t.Errorf("%s: got %+v, want allowed=%v with a rule", c.name, v, c.want)
		}
	}
}

func TestAllowsName(t *testing.T) {
	d := testDeny()
	cp, err := d.Compile(Policy{Egress: EgressAllowlist, AllowOut: []string{"*.pypi.org"}})
	if err != nil {
		t.Fatal(err)
	}
	if !cp.AllowsName("files.pypi.org", 443).Allowed || cp.AllowsName("evil.example", 443).Allowed {
		t.Error("an allow-list of names must answer exactly its names")
	}
	inet, _ := d.Compile(Policy{Egress: EgressInternet, DenyOut: []string{"*.tracker.example"}})
	if inet.AllowsName("x.tracker.example", 443).Allowed || !inet.AllowsName("example.org", 443).Allowed {
		t.Error("internet with a deny_out name")
	}
	none, _ := d.Compile(Policy{Egress: EgressNone})
	if none.AllowsName("example.org", 443).Allowed {
		t.Error("egress none answers no name")
	}
}
