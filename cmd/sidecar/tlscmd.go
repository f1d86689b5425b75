package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/sidecar-sandbox/sidecar/tls/certgen"
)

func init() {
	register("tls", command{summary: "make a private CA, server and client certificates (tls gen)",
		usage: "usage: sidecar tls gen --dir DIR --host NAME --ip ADDR [--client NAME]... [--force]", subs: []string{"gen"}, run: runTLS})
}

// File names `sidecar tls gen` writes in its --dir.
const (
	tlsCACert     = "ca.crt"
	tlsCAKey      = "ca.key"
	tlsServerCert = "server.crt"
	tlsServerKey  = "server.key"
)

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

func runTLS(_ context.Context, args []string) error {
	if len(args) == 0 || args[0] != "gen" {
		fmt.Fprintln(os.Stderr, "usage: sidecar tls gen --dir DIR --host NAME --ip ADDR [--client NAME]... [--force]")
		return usageError{}
	}
	return tlsGen(args[1:], os.Stdout)
}

func tlsGen(args []string, stdout io.Writer) error {
	flags := newLocalFlagSet("tls gen")
	var hosts, ips, clients stringList
	dir := flags.String("dir", "", "directory for the files (created 0700); an existing ca.crt/ca.key there is reused")
	flags.Var(&hosts, "host", "DNS name of the daemon (repeatable)")
	flags.Var(&ips, "ip", "IP address of the daemon (repeatable)")
	flags.Var(&clients, "client", "issue a client certificate for mTLS with this name (repeatable)")
	force := flags.Bool("force", false, "replace existing server and client files (the CA is always kept)")
	flags.Usage = func() {
		fmt.Fprintln(flags.Output(), `usage: sidecar tls gen --dir DIR --host NAME --ip ADDR [--client NAME]... [--force]

Makes a private CA (ECDSA P-256, 10 years) in DIR, or reuses the one there, and issues a
server certificate (397 days) for the hosts and IPs and, with --client, client
certificates (397 days) for mTLS. Existing files are never overwritten without --force.`)
		writeFlags(flags.Output(), flags)
	}
	if err := parseFlags(flags, args); err != nil {
		return err
	}
	if flags.NArg() > 0 {
		return usagef("tls gen: unexpected argument %q", flags.Arg(0))
	}
	if *dir == "" {
		return errors.New("tls gen: --dir is required")
	}
	for _, ip := range ips {
		if net.ParseIP(ip) == nil {
			return fmt.Errorf("tls gen: --ip %q is not an IP address", ip)
		}
	}
	serverHosts := append(append([]string{}, hosts...), ips...)
	if len(serverHosts) == 0 && len(clients) == 0 {
		return errors.New("tls gen: give --host/--ip for a server certificate, --client for client certificates, or both")
	}
	for _, c := range clients {
		if c == "" || c == "." || c == ".." || strings.ContainsAny(c, `/\`) {
			return fmt.Errorf("tls gen: --client %q must be a plain name (it names the files)", c)
		}
	}

	// Plan every output first so that a refusal leaves nothing half-made.
	type output struct {
		name string
		data []byte
		perm fs.FileMode
	}
	var outputs []output
	var planned []string
	plan := func(names ...string) { planned = append(planned, names...) }
	if len(serverHosts) > 0 {
		plan(tlsServerCert, tlsServerKey)
	}
	for _, c := range clients {
		plan("client-"+c+".crt", "client-"+c+".key")
	}
	if !*force {
		for _, name := range planned {
			if _, err := os.Lstat(filepath.Join(*dir, name)); err == nil {
				return fmt.Errorf("tls gen: %s exists; use --force to replace it", filepath.Join(*dir, name))
			}
		}
	}

	caCertFile, caKeyFile := filepath.Join(*dir, tlsCACert), filepath.Join(*dir, tlsCAKey)
	ca, reused, err := loadOrNewCA(caCertFile, caKeyFile)
	if err != nil {
		return err
	}
	if !reused {
		outputs = append(outputs, output{tlsCAKey, ca.KeyPEM, 0o600}, output{tlsCACert, ca.CertPEM, 0o644})
	}
	var serverPEM []byte
	if len(serverHosts) > 0 {
		certPEM, keyPEM, err := ca.IssueServer(serverHosts, 0)
		if err != nil {
			return fmt.Errorf("tls gen: %w", err)
		}
		serverPEM = certPEM
		outputs = append(outputs, output{tlsServerKey, keyPEM, 0o600}, output{tlsServerCert, certPEM, 0o644})
	}
	for _, c := range clients {
		certPEM, keyPEM, err := ca.IssueClient(c, 0)
		if err != nil {
			return fmt.Errorf("tls gen: %w", err)
		}
		outputs = append(outputs, output{"client-" + c + ".key", keyPEM, 0o600}, output{"client-" + c + ".crt", certPEM, 0o644})
	}

	if err := os.MkdirAll(*dir, 0o700); err != nil {
		return fmt.Errorf("tls gen: %w", err)
	}
	for _, o := range outputs {
		if err := writeCertFile(filepath.Join(*dir, o.name), o.data, o.perm, *force); err != nil {
			return fmt.Errorf("tls gen: %w", err)
		}
	}
	return printTLSSummary(stdout, *dir, ca, reused, serverPEM, serverHosts, clients)
}

// loadOrNewCA reuses the CA in the files when both exist, and makes one when neither does.
func loadOrNewCA(certFile, keyFile string) (*certgen.CA, bool, error) {
	_, certErr := os.Lstat(certFile)
	_, keyErr := os.Lstat(keyFile)
	switch {
	case certErr == nil && keyErr == nil:
		ca, err := certgen.LoadCA(certFile, keyFile)
		if err != nil {
			return nil, false, fmt.Errorf("tls gen: existing CA: %w", err)
		}
		return ca, true, nil
	case certErr == nil || keyErr == nil:
		return nil, false, fmt.Errorf("tls gen: only one of %s and %s exists; restore or remove it", certFile, keyFile)
	}
	ca, err := certgen.NewCA("sidecar CA", 0)
	if err != nil {
		return nil, false, fmt.Errorf("tls gen: %w", err)
	}
	return ca, false, nil
}

// writeCertFile writes data to a temporary file and then links it into place, which fails
// if name exists (no overwrite race), or renames over it with force.
func writeCertFile(name string, data []byte, perm fs.FileMode, force bool) (err error) {
	f, err := os.CreateTemp(filepath.Dir(name), "."+filepath.Base(name)+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if force {
		return os.Rename(f.Name(), name)
	}
	return os.Link(f.Name(), name)
}

func printTLSSummary(w io.Writer, dir string, ca *certgen.CA, reused bool, serverPEM []byte, serverHosts, clients []string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	path := func(name string) string { return filepath.Join(abs, name) }
	caFP, err := certgen.Fingerprint(ca.CertPEM)
	if err != nil {
		return err
	}
	verb := "created"
	if reused {
		verb = "reused"
	}
	fmt.Fprintf(w, "CA %s: %s\n  sha256 %s\n", verb, path(tlsCACert), caFP)
	fmt.Fprintf(w, "  keep %s offline or root-only: it can issue certificates the daemon trusts\n", path(tlsCAKey))
	if serverPEM != nil {
		fp, err := certgen.Fingerprint(serverPEM)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "server certificate for %s: %s\n  sha256 %s\n", strings.Join(serverHosts, ", "), path(tlsServerCert), fp)
	}

	fmt.Fprintln(w, "\n# daemon (/etc/sidecar/sidecar.env):")
	if serverPEM != nil {
		fmt.Fprintf(w, "SIDECAR_TLS_CERT_FILE=%s\nSIDECAR_TLS_KEY_FILE=%s\n", path(tlsServerCert), path(tlsServerKey))
	}
	if len(clients) > 0 {
		fmt.Fprintf(w, "SIDECAR_TLS_CLIENT_CA_FILE=%s\n", path(tlsCACert))
	}

	fmt.Fprintln(w, "\n# client (app, worker, sidecar CLI); copy the CA file to the client host:")
	if len(serverHosts) > 0 {
		fmt.Fprintf(w, "SANDBOX_REMOTE_URL=https://%s\n", net.JoinHostPort(serverHosts[0], "7443"))
	}
	fmt.Fprintf(w, "SANDBOX_REMOTE_CA_FILE=%s\n", path(tlsCACert))
	for _, c := range clients {
		fmt.Fprintf(w, "# client %q:\nSANDBOX_REMOTE_CLIENT_CERT_FILE=%s\nSANDBOX_REMOTE_CLIENT_KEY_FILE=%s\n",
			c, path("client-"+c+".crt"), path("client-"+c+".key"))
	}
	return nil
}
