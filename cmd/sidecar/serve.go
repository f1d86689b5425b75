package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/sidecar-sandbox/sidecar/internal/daemon"
	"github.com/sidecar-sandbox/sidecar/lease"
	"github.com/sidecar-sandbox/sidecar/systemd"
	"github.com/sidecar-sandbox/sidecar/tls/certgen"
	"github.com/sidecar-sandbox/sidecar/tls/tlsconfig"
)

func init() {
	register("serve", command{summary: "run the daemon (configured by SIDECAR_* environment variables)",
		usage: "usage: sidecar serve\n\nThe daemon is configured by environment variables; see README.md and docs/operations.md.", run: runServe})
}

// serveConfig is the daemon's environment: the daemon's configuration itself (read
// straight into daemon.Config, whose tags name most variables) and what serve turns into
// parts of it (secret files, TLS files, the uid range, logging). Names are fixed
// by the wire contract (docs/api.md, Configuration); the few extra knobs say so in
// docs/operations.md.
type serveConfig struct {
	daemon.Config

	AuthTokenFile     string `env:"SIDECAR_AUTH_TOKEN_FILE"`
	PreviousTokenFile string `env:"SIDECAR_AUTH_TOKEN_PREVIOUS_FILE"`

	TLSCertFile     string   `env:"SIDECAR_TLS_CERT_FILE"`
	TLSKeyFile      string   `env:"SIDECAR_TLS_KEY_FILE"`
	TLSClientCAFile string   `env:"SIDECAR_TLS_CLIENT_CA_FILE"`
	TLSSelfSigned   bool     `env:"SIDECAR_TLS_SELF_SIGNED"`
	TLSHosts        []string `env:"SIDECAR_TLS_HOSTS" envSeparator:","`

	// UIDRange is the lease uids; "": a block of 65,536 derived from the state dir and
	// recorded there (lease.DefaultUIDRange), so that daemons on one host never share uids.
	UIDRange string `env:"SIDECAR_UID_RANGE"`

	LogLevel  string `env:"SIDECAR_LOG_LEVEL" envDefault:"info"`
	LogFormat string `env:"SIDECAR_LOG_FORMAT" envDefault:"text"`
}

// loadServeConfig reads and checks the environment, reporting every bad variable at once:
// this command's own settings (secrets' sources, TLS, the uid range, logging) here, the
// daemon's by daemon.Config.Check.
func loadServeConfig(environ map[string]string) (serveConfig, error) {
	c := serveConfig{Config: daemon.ServeDefaults()}
	var errs []error
	if err := env.ParseWithOptions(&c, env.Options{Environment: environ}); err != nil {
		var agg env.AggregateError
		if errors.As(err, &agg) {
			errs = append(errs, agg.Errors...)
		} else {
			errs = append(errs, err)
		}
	}
	var err error
	if c.SharedToken, err = secret("SIDECAR_AUTH_TOKEN", c.SharedToken, c.AuthTokenFile, "auth-token"); err != nil {
		errs = append(errs, err)
	}
	if c.PreviousToken, err = secret("SIDECAR_AUTH_TOKEN_PREVIOUS", c.PreviousToken, c.PreviousTokenFile, ""); err != nil {
		errs = append(errs, err)
	}
	switch {
	case c.TLSSelfSigned && (c.TLSCertFile != "" || c.TLSKeyFile != ""):
		errs = append(errs, errors.New("SIDECAR_TLS_SELF_SIGNED and SIDECAR_TLS_CERT_FILE/KEY_FILE exclude each other"))
	case !c.TLSSelfSigned && (c.TLSCertFile == "" || c.TLSKeyFile == ""):
		errs = append(errs, errors.New("TLS is required: set SIDECAR_TLS_CERT_FILE and SIDECAR_TLS_KEY_FILE, or SIDECAR_TLS_SELF_SIGNED=true for development (there is no plain-HTTP mode)"))
	}
	if c.UIDRange != "" {
		if c.UIDFirst, c.UIDLast, err = parseUIDRange(c.UIDRange); err != nil {
			errs = append(errs, fmt.Errorf("SIDECAR_UID_RANGE: %v", err))
		}
	}
	if _, err := logLevel(c.LogLevel); err != nil {
		errs = append(errs, err)
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		errs = append(errs, fmt.Errorf("SIDECAR_LOG_FORMAT must be text or json, not %q", c.LogFormat))
	}
	if err := c.Check(); err != nil {
		errs = append(errs, err)
	}
	if c.StateDir == "" {
		c.StateDir = defaultStateDir()
	}
	if c.WorkRoot == "" {
		c.WorkRoot = filepath.Join(c.StateDir, "leases")
	}
	if c.CgroupParent == "" {
		c.CgroupParent = defaultCgroupParent(c.StateDir)
	}
	return c, errors.Join(errs...)
}

// defaultCgroupParent gives each state dir a cgroup parent of its own, so that a second
// daemon on the host (a developer's beside the service) never shares one with the first:
// "sidecar" for the service's /var/lib/sidecar, "sidecar-<8 hex digits of the state dir's
// absolute path>" for any other.
func defaultCgroupParent(stateDir string) string {
	abs, err := filepath.Abs(stateDir)
	if err != nil {
		abs = stateDir
	}
	if abs == "/var/lib/sidecar" {
		return "sidecar"
	}
	sum := sha256.Sum256([]byte(abs))
	return "sidecar-" + hex.EncodeToString(sum[:4])
}

// secret reads a secret from its variable, its _FILE variant or, under systemd, the
// credential LoadCredential= put in $CREDENTIALS_DIRECTORY. Errors never echo a value.
func secret(name, value, file, credential string) (string, error) {
	if value != "" && file != "" {
		return "", fmt.Errorf("%s and %s_FILE exclude each other", name, name)
	}
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("%s_FILE: %v", name, err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	if value == "" && credential != "" {
		v, ok, err := systemd.Credential(credential)
		if err != nil {
			return "", fmt.Errorf("%s from systemd credential %q: %v", name, credential, err)
		}
		if ok {
			return strings.TrimSpace(v), nil
		}
	}
	return value, nil
}

func parseUIDRange(s string) (first, last int, err error) {
	a, b, ok := strings.Cut(s, "-")
	if !ok {
		return 0, 0, fmt.Errorf("want FIRST-LAST, got %q", s)
	}
	first, err1 := strconv.Atoi(strings.TrimSpace(a))
	last, err2 := strconv.Atoi(strings.TrimSpace(b))
	if err1 != nil || err2 != nil || first < 1000 || last < first || last > 1<<31-2 {
		return 0, 0, fmt.Errorf("want FIRST-LAST with 1000 <= FIRST <= LAST, got %q", s)
	}
	return first, last, nil
}

func logLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return l, fmt.Errorf("SIDECAR_LOG_LEVEL must be debug, info, warn or error, not %q", s)
	}
	return l, nil
}

func defaultStateDir() string {
	if os.Geteuid() == 0 {
		return "/var/lib/sidecar"
	}
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "sidecar")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".local", "state", "sidecar")
}

func environMap() map[string]string {
	m := map[string]string{}
	for _, kv := range os.Environ() {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}

func newLogger(c serveConfig) *slog.Logger {
	lvl, _ := logLevel(c.LogLevel)
	opts := &slog.HandlerOptions{Level: lvl}
	if c.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}

func runServe(ctx context.Context, args []string) error {
	fs := newLocalFlagSet("serve")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: sidecar serve\n\nThe daemon is configured by environment variables; see README.md and docs/operations.md.")
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	c, err := loadServeConfig(environMap())
	if err != nil {
		return fmt.Errorf("configuration:\n  %s", strings.ReplaceAll(err.Error(), "\n", "\n  "))
	}
	log := newLogger(c)

	certFile, keyFile := c.TLSCertFile, c.TLSKeyFile
	if c.TLSSelfSigned {
		var created bool
		certFile, keyFile, created, err = certgen.EnsureSelfSigned(filepath.Join(c.StateDir, "tls"), selfSignedHosts(c))
		if err != nil {
			return fmt.Errorf("self-signed TLS: %w", err)
		}
		pem, _ := os.ReadFile(certFile)
		fp, _ := certgen.Fingerprint(pem)
		log.Info("self-signed TLS certificate", "created", created, "file", certFile, "sha256", fp)
	}
	reloader, err := tlsconfig.NewReloader(certFile, keyFile, log.With("component", "tls"))
	if err != nil {
		return err
	}
	tlsCfg, err := tlsconfig.Server(reloader, c.TLSClientCAFile)
	if err != nil {
		return err
	}

	cfg := c.Config
	cfg.Version, cfg.TLS, cfg.CertNotAfter, cfg.Logger = version, tlsCfg, reloader.NotAfter, log
	switch {
	case os.Geteuid() != 0:
		cfg.UIDFirst, cfg.UIDLast = 0, 0 // only root can switch uids
	case c.UIDRange == "":
		if cfg.UIDFirst, cfg.UIDLast, err = lease.DefaultUIDRange(cfg.StateDir); err != nil {
			return err
		}
	}
	d, err := daemon.Start(ctx, cfg)
	if err != nil {
		return err
	}
	printClientLines(c, d.Addr(), certFile)

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go reloader.Watch(runCtx, 30*time.Second)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	// SIGUSR1 drains (no new lease; the existing ones run to their end), SIGUSR2 ends a
	// drain: the same as POST and DELETE /v1/drain, for an operator on the host.
	drain := make(chan os.Signal, 1)
	signal.Notify(drain, syscall.SIGUSR1, syscall.SIGUSR2)
	defer signal.Stop(drain)
	go func() {
		for {
			select {
			case sig := <-drain:
				d.SetDraining(sig == syscall.SIGUSR1)
			case <-hup:
				_, _ = systemd.Reloading()
				if err := reloader.Reload(); err != nil {
					log.Error("TLS reload failed: keeping the previous certificate", "err", err)
				}
				_, _ = systemd.Ready()
			case <-runCtx.Done():
				return
			}
		}
	}()
	_, _ = systemd.Ready()
	go systemd.RunWatchdog(runCtx, d.Healthy, log.With("component", "watchdog"))

	select {
	case <-ctx.Done():
		log.Info("shutting down", "reason", context.Cause(ctx))
	case err := <-d.Done():
		if err != nil {
			log.Error("serve failed", "err", err)
		}
	}
	_, _ = systemd.Stopping()
	return d.Close(context.Background())
}

func selfSignedHosts(c serveConfig) []string {
	hosts := append([]string{"localhost", "127.0.0.1", "::1"}, c.TLSHosts...)
	if h, _, err := net.SplitHostPort(c.ListenAddr); err == nil && h != "" && h != "0.0.0.0" && h != "::" {
		hosts = append(hosts, h)
	}
	return hosts
}

// printClientLines tells the operator how to point a client at this daemon. The token
// itself is never printed here.
func printClientLines(c serveConfig, addr net.Addr, certFile string) {
	h, _, _ := net.SplitHostPort(c.ListenAddr)
	if h == "" || h == "0.0.0.0" || h == "::" {
		h = "127.0.0.1"
	}
	host := net.JoinHostPort(h, strconv.Itoa(addr.(*net.TCPAddr).Port))
	fmt.Fprintln(os.Stderr, "\n# client environment (app, worker, `sidecar` CLI):")
	fmt.Fprintln(os.Stderr, "export SANDBOX_PROVIDER=remote")
	fmt.Fprintf(os.Stderr, "export SANDBOX_REMOTE_URL=https://%s\n", host)
	if c.TLSSelfSigned {
		fmt.Fprintf(os.Stderr, "export SANDBOX_REMOTE_CA_FILE=%s\n", certFile)
	}
	if c.AuthTokenFile != "" {
		fmt.Fprintf(os.Stderr, "export SANDBOX_REMOTE_AUTH_TOKEN_FILE=%s\n", c.AuthTokenFile)
	} else {
		fmt.Fprintln(os.Stderr, "export SANDBOX_REMOTE_AUTH_TOKEN=<the value of SIDECAR_AUTH_TOKEN>")
	}
	fmt.Fprintln(os.Stderr)
}
