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
	"github.com/sidecar-sandbox/sidecar/internal/process"
	"github.com/sidecar-sandbox/sidecar/internal/sandbox"
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

// loadServeConfig reads and checks the environment, reporting every bad variable at once.
func loadServeConfig(environ map[string]string) (serveConfig, error) {
	c := serveConfig{Config: daemon.Config{ // the lease limits' defaults (env tags set the others)
		DefaultLimits: lease.Limits{MemoryBytes: 1 << 30, CPUMillicores: 1000, Pids: 512, DiskBytes: 10 << 30},
		MaxLimits:     lease.Limits{MemoryBytes: 8 << 30, CPUMillicores: 4000, Pids: 4096, DiskBytes: 100 << 30},
	}}
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
	} else if c.SharedToken == "" {
		errs = append(errs, errors.New("SIDECAR_AUTH_TOKEN (or SIDECAR_AUTH_TOKEN_FILE) is required: make one with `sidecar token`"))
	} else if len(c.SharedToken) < 32 {
		errs = append(errs, fmt.Errorf("SIDECAR_AUTH_TOKEN must be at least 32 characters (it has %d): make one with `sidecar token`", len(c.SharedToken)))
	}
	if c.PreviousToken, err = secret("SIDECAR_AUTH_TOKEN_PREVIOUS", c.PreviousToken, c.PreviousTokenFile, ""); err != nil {
		errs = append(errs, err)
	} else if c.PreviousToken != "" && len(c.PreviousToken) < 32 {
		errs = append(errs, errors.New("SIDECAR_AUTH_TOKEN_PREVIOUS must be at least 32 characters"))
	}
	switch {
	case c.TLSSelfSigned && (c.TLSCertFile != "" || c.TLSKeyFile != ""):
		errs = append(errs, errors.New("SIDECAR_TLS_SELF_SIGNED and SIDECAR_TLS_CERT_FILE/KEY_FILE exclude each other"))
	case !c.TLSSelfSigned && (c.TLSCertFile == "" || c.TLSKeyFile == ""):
		errs = append(errs, errors.New("TLS is required: set SIDECAR_TLS_CERT_FILE and SIDECAR_TLS_KEY_FILE, or SIDECAR_TLS_SELF_SIGNED=true for development (there is no plain-HTTP mode)"))
	}
	if _, _, err := net.SplitHostPort(c.ListenAddr); err != nil {
		errs = append(errs, fmt.Errorf("SIDECAR_LISTEN_ADDR: %v", err))
	}
	if c.Isolation != "strict" && c.Isolation != "none" {
		errs = append(errs, fmt.Errorf("SIDECAR_ISOLATION must be strict or none, not %q", c.Isolation))
	}
	if c.DiskQuota != "auto" && c.DiskQuota != "loop" && c.DiskQuota != "off" {
		errs = append(errs, fmt.Errorf("SIDECAR_DISK_QUOTA must be auto, loop or off, not %q", c.DiskQuota))
	}
	if c.MinLandlockABI < 0 || c.MinLandlockABI > sandbox.MaxKnownLandlockABI {
		errs = append(errs, fmt.Errorf("SIDECAR_MIN_LANDLOCK_ABI must be 0 to %d, not %d", sandbox.MaxKnownLandlockABI, c.MinLandlockABI))
	}
	if c.RequireCgroup != "" && c.RequireCgroup != "v1" && c.RequireCgroup != "v2" {
		errs = append(errs, fmt.Errorf("SIDECAR_REQUIRE_CGROUP must be v1, v2 or empty, not %q", c.RequireCgroup))
	}
	if c.MaxPTYs < 1 || c.MaxPTYs > 4096 {
		errs = append(errs, fmt.Errorf("SIDECAR_MAX_PTYS must be 1 to 4096, not %d", c.MaxPTYs))
	}
	if c.Seccomp != "strict" && c.Seccomp != "off" {
		errs = append(errs, fmt.Errorf("SIDECAR_SECCOMP must be strict or off, not %q", c.Seccomp))
	}
	if _, err := sandbox.LeasePathDirs(c.LeasePath); err != nil {
		errs = append(errs, err)
	}
	if c.UIDRange != "" {
		if c.UIDFirst, c.UIDLast, err = parseUIDRange(c.UIDRange); err != nil {
			errs = append(errs, fmt.Errorf("SIDECAR_UID_RANGE: %v", err))
		}
	}
	if c.MaxLeases < 1 {
		errs = append(errs, errors.New("SIDECAR_MAX_LEASES must be at least 1"))
	}
	if c.CapacityMemoryBytes < 0 {
		errs = append(errs, errors.New("SIDECAR_CAPACITY_MEMORY_BYTES must not be negative (0 or unset: the host's MemTotal)"))
	}
	if c.DefaultTTL <= 0 || c.MaxTTL < c.DefaultTTL {
		errs = append(errs, errors.New("SIDECAR_LEASE_TTL must be positive and at most SIDECAR_LEASE_MAX_TTL"))
	}
	def, max := c.DefaultLimits, c.MaxLimits
	for _, l := range []struct {
		name             string
		def, max_, floor int64
	}{
		{"MEMORY_BYTES", def.MemoryBytes, max.MemoryBytes, lease.MinMemoryBytes},
		{"CPU_MILLICORES", def.CPUMillicores, max.CPUMillicores, lease.MinCPUMillicores},
		{"PIDS", def.Pids, max.Pids, 1},
		{"DISK_BYTES", def.DiskBytes, max.DiskBytes, 1},
	} {
		if l.def < l.floor || l.def > l.max_ {
			errs = append(errs, fmt.Errorf("SIDECAR_DEFAULT_LIMITS_%s must be at least %d and at most SIDECAR_MAX_LIMITS_%s", l.name, l.floor, l.name))
		}
	}
	if c.ScriptMaxPerLease < 0 {
		errs = append(errs, errors.New("SIDECAR_SCRIPT_MAX_PER_LEASE must not be negative (0: half of SIDECAR_SCRIPT_WORKERS)"))
	}
	if c.MaxOutputBytes < 1024 {
		errs = append(errs, errors.New("SIDECAR_MAX_OUTPUT_BYTES must be at least 1024"))
	}
	if c.OutputBufferBytes < process.MinBufferBytes {
		errs = append(errs, fmt.Errorf("SIDECAR_OUTPUT_BUFFER_BYTES must be at least %d (two reads of a process's output)", process.MinBufferBytes))
	}
	if c.MaxExecs < 1 || c.OutputBudgetBytes < 2*c.MaxOutputBytes {
		errs = append(errs, errors.New("SIDECAR_MAX_EXECS_PER_LEASE must be positive and SIDECAR_OUTPUT_BUDGET_BYTES at least twice SIDECAR_MAX_OUTPUT_BYTES"))
	}
	if c.MaxSearches < 1 {
		errs = append(errs, errors.New("SIDECAR_MAX_SEARCHES must be positive"))
	}
	if c.SearchBudgetBytes < 1<<20 {
		errs = append(errs, errors.New("SIDECAR_SEARCH_BUDGET_BYTES must be at least 1048576 (1 MiB)"))
	}
	if c.MaxShells < 1 {
		errs = append(errs, errors.New("SIDECAR_MAX_SHELLS_PER_LEASE must be positive"))
	}
	if _, err := logLevel(c.LogLevel); err != nil {
		errs = append(errs, err)
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		errs = append(errs, fmt.Errorf("SIDECAR_LOG_FORMAT must be text or json, not %q", c.LogFormat))
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
