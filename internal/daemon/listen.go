package daemon

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"syscall"
)

// listenError says why the daemon cannot listen on addr and names the setting that fixes
// it: a bare "address already in use" leaves an operator to guess where the address came
// from.
func listenError(addr string, err error) error {
	var hint string
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		_, port, _ := net.SplitHostPort(addr)
		hint = fmt.Sprintf("the port is taken (another sidecar? `ss -ltnp 'sport = :%s'` names the program): stop it, or set SIDECAR_LISTEN_ADDR to a free address", port)
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		hint = "this host has no such address: set SIDECAR_LISTEN_ADDR to one of its addresses (`ip -br addr`), or 0.0.0.0:PORT for all"
	case errors.Is(err, syscall.EACCES):
		hint = "ports below 1024 need root or CAP_NET_BIND_SERVICE: set SIDECAR_LISTEN_ADDR to a port of 1024 or more"
	default:
		hint = "check SIDECAR_LISTEN_ADDR (host:port)"
	}
	return fmt.Errorf("listen on %s (SIDECAR_LISTEN_ADDR): %w; %s", addr, err, hint)
}

// warnCertMismatch logs a warning when the daemon listens on one IP address and its
// certificate does not name it: clients dialling https://<that address> would fail
// verification ("certificate is valid for …, not …") with no word of what to change.
// A name (DNS) the certificate carries may be how clients reach the daemon, so the
// warning says so rather than refusing to start.
func warnCertMismatch(log *slog.Logger, addr string, cfg *tls.Config) {
	host, _, err := net.SplitHostPort(addr)
	ip := net.ParseIP(host)
	if err != nil || ip == nil || ip.IsUnspecified() || cfg == nil || cfg.GetCertificate == nil {
		return
	}
	c, err := cfg.GetCertificate(&tls.ClientHelloInfo{})
	if err != nil || c == nil || len(c.Certificate) == 0 {
		return
	}
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil || leaf.VerifyHostname(host) == nil {
		return
	}
	log.Warn("the TLS certificate does not name the listen address: clients dialling https://"+addr+" will fail to verify it; "+
		"with SIDECAR_TLS_SELF_SIGNED, add the address to SIDECAR_TLS_HOSTS, else make a certificate naming it (sidecar tls gen --ip "+host+" --force)",
		"listen_addr", addr, "cert_dns_names", leaf.DNSNames, "cert_ip_addresses", leaf.IPAddresses)
}
