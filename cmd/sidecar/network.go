package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// policyFlags are the network flags of `leases new` and `leases network`.
type policyFlags struct {
	egress   string
	allowOut multiFlag
	denyOut  multiFlag
}

func addPolicyFlags(fs *flag.FlagSet) *policyFlags {
	p := &policyFlags{}
	fs.StringVar(&p.egress, "network", "", "egress: none, allowlist or internet (empty: the daemon's default, SIDECAR_NETWORK_DEFAULT)")
	fs.Var(&p.allowOut, "allow-out", "`DEST` where the lease may connect: IP, CIDR or domain (*.example.com), optional :port (repeatable, or comma-separated)")
	fs.Var(&p.denyOut, "deny-out", "`DEST` where the lease may not connect, same forms (repeatable, or comma-separated); --allow-out wins over it")
	return p
}

// policy is the policy the flags say, nil when they say nothing (the daemon's default).
// --allow-out alone means allowlist and --deny-out alone internet; with both, --network
// must say which.
func (p *policyFlags) policy() (*apitype.NetworkPolicy, error) {
	allow, err := ruleList(p.allowOut, "--allow-out")
	if err != nil {
		return nil, err
	}
	deny, err := ruleList(p.denyOut, "--deny-out")
	if err != nil {
		return nil, err
	}
	egress := p.egress
	switch egress {
	case "":
		switch {
		case len(allow) > 0 && len(deny) > 0:
			return nil, usagef("--allow-out with --deny-out: say --network allowlist or --network internet")
		case len(allow) > 0:
			egress = apitype.EgressAllowlist
		case len(deny) > 0:
			egress = apitype.EgressInternet
		default:
			return nil, nil
		}
	case apitype.EgressNone:
		if len(allow)+len(deny) > 0 {
			return nil, usagef("--network none reaches nothing: drop --allow-out and --deny-out, or say --network allowlist")
		}
	case apitype.EgressAllowlist, apitype.EgressInternet:
	case "host":
		return nil, usagef("--network host: a lease cannot ask for the host's network; that is the operator's SIDECAR_NETWORK_ISOLATION=host")
	default:
		return nil, usagef("--network %q: want none, allowlist or internet", p.egress)
	}
	return &apitype.NetworkPolicy{Egress: egress, AllowOut: allow, DenyOut: deny}, nil
}

// ruleList splits repeated, comma-separated entries; an empty entry is a typo.
func ruleList(values []string, flagName string) ([]string, error) {
	var out []string
	for _, v := range values {
		for _, e := range strings.Split(v, ",") {
			e = strings.TrimSpace(e)
			if e == "" {
				return nil, usagef("%s %q: empty entry", flagName, v)
			}
			out = append(out, e)
		}
	}
	return out, nil
}

// networkArgs are the parsed arguments of `leases network`.
type networkArgs struct {
	lease  string
	policy apitype.NetworkPolicy
	output string
}

const leasesNetworkUsage = "usage: sidecar leases network ID --network none|allowlist|internet [--allow-out X]... [--deny-out X]... [-o text|json]"

func parseLeasesNetwork(args []string) (networkArgs, error) {
	fs := newFlagSet("leases network", leasesNetworkUsage)
	pf := addPolicyFlags(fs)
	output := outputFlag(fs, "text", "json")
	pos, err := operands(fs, args, 1, leasesNetworkUsage)
	if err != nil {
		return networkArgs{}, err
	}
	p, err := pf.policy()
	if err != nil {
		return networkArgs{}, err
	}
	if p == nil {
		return networkArgs{}, usagef("leases network: say the new policy (--network, --allow-out, --deny-out)\n%s", leasesNetworkUsage)
	}
	return networkArgs{lease: pos[0], policy: *p, output: output.value}, nil
}

// leasesNetwork replaces a lease's policy: new connections follow it at once.
func leasesNetwork(ctx context.Context, args []string) error {
	a, err := parseLeasesNetwork(args)
	if err != nil {
		return err
	}
	c, err := newClient("")
	if err != nil {
		return err
	}
	l, err := c.SetNetwork(ctx, a.lease, a.policy)
	if err != nil {
		return err
	}
	if a.output == "json" {
		return printJSON(os.Stdout, l)
	}
	fmt.Println(policyText(l.Network))
	return nil
}

// policyText is a policy on one line: "allowlist allow_out=pypi.org,10.0.0.5:5432".
func policyText(p apitype.NetworkPolicy) string {
	s := p.Egress
	if len(p.AllowOut) > 0 {
		s += " allow_out=" + strings.Join(p.AllowOut, ",")
	}
	if len(p.DenyOut) > 0 {
		s += " deny_out=" + strings.Join(p.DenyOut, ",")
	}
	return s
}
