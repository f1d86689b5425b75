package network

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// The lease's resolver answers A and AAAA questions for names its policy could allow, from
// the daemon's resolver; everything else gets an empty answer. A name the policy refuses is
// REFUSED, so that DNS carries nothing out of a lease that its policy keeps in.
const (
	dnsTTL         = 30
	dnsConcurrency = 16 // questions answered at once per lease; more wait
	dnsTimeout     = 5 * time.Second
)

func (ln *leaseNet) serveDNS(pc net.PacketConn) {
	slots := make(chan struct{}, dnsConcurrency)
	for {
		buf := make([]byte, 1500)
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		slots <- struct{}{}
		go func() {
			defer func() { <-slots }()
			if out := ln.answer(buf[:n]); out != nil {
				_, _ = pc.WriteTo(out, from)
			}
		}()
	}
}

// answer builds the reply to one query, nil for what is not a query.
func (ln *leaseNet) answer(query []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil || h.Response {
		return nil
	}
	q, err := p.Question()
	if err != nil {
		return reply(h, nil, dnsmessage.RCodeFormatError, nil)
	}
	if h.OpCode != 0 {
		return reply(h, &q, dnsmessage.RCodeNotImplemented, nil)
	}
	name := strings.TrimSuffix(q.Name.String(), ".")
	cp := ln.policy.Load()
	if v := cp.AllowsName(name, 0); !v.Allowed {
		ln.log.Debug("lease DNS question refused", "name", name, "rule", v.Rule)
		return reply(h, &q, dnsmessage.RCodeRefused, nil)
	}
	network := ""
	switch q.Type {
	case dnsmessage.TypeA:
		network = "ip4"
	case dnsmessage.TypeAAAA:
		network = "ip6"
	default:
		return reply(h, &q, dnsmessage.RCodeSuccess, nil)
	}
	ctx, cancel := context.WithTimeout(context.Background(), dnsTimeout)
	defer cancel()
	addrs, err := ln.m.cfg.Resolver.LookupNetIP(ctx, network, name)
	var dnsErr *net.DNSError
	switch {
	case errors.As(err, &dnsErr) && dnsErr.IsNotFound:
		return reply(h, &q, dnsmessage.RCodeNameError, nil)
	case err != nil:
		return reply(h, &q, dnsmessage.RCodeServerFailure, nil)
	}
	return reply(h, &q, dnsmessage.RCodeSuccess, addrs)
}

func reply(h dnsmessage.Header, q *dnsmessage.Question, rcode dnsmessage.RCode, addrs []netip.Addr) []byte {
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true, RCode: rcode})
	b.EnableCompression()
	if q == nil {
		out, _ := b.Finish()
		return out
	}
	_ = b.StartQuestions()
	_ = b.Question(*q)
	_ = b.StartAnswers()
	rh := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: dnsTTL}
	for _, a := range addrs {
		switch {
		case a.Is4() && q.Type == dnsmessage.TypeA:
			_ = b.AResource(rh, dnsmessage.AResource{A: a.As4()})
		case a.Is6() && !a.Is4In6() && q.Type == dnsmessage.TypeAAAA:
			_ = b.AAAAResource(rh, dnsmessage.AAAAResource{AAAA: a.As16()})
		}
	}
	out, err := b.Finish()
	if err != nil {
		return nil
	}
	return out
}
