package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/internal/daemontest"
)

// target is the daemon under soak: one this program started (local), or a remote one.
type target struct {
	client *client.Client
	hc     *http.Client // for /metrics
	url    string
	token  string
	local  *daemontest.Binary // nil for a remote daemon
}

func openTarget(ctx context.Context, o options, log *slog.Logger) (*target, error) {
	if os.Getenv(client.EnvURL) != "" {
		cfg, err := client.ConfigFromEnv()
		if err != nil {
			return nil, err
		}
		c, err := client.New(cfg)
		if err != nil {
			return nil, err
		}
		return &target{client: c, url: cfg.URL, token: cfg.Token, hc: daemontest.HTTPClient(cfg.CAFile, 10*time.Second)}, nil
	}
	return startDaemon(ctx, o, log)
}

// startDaemon runs a private copy of the built daemon with its own state dir, port,
// cgroup parent and uid range.
func startDaemon(ctx context.Context, o options, log *slog.Logger) (*target, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("starting a daemon needs root (cgroups, uids); or point SANDBOX_REMOTE_URL at one")
	}
	bin, err := filepath.Abs(o.bin)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("daemon binary: %w (run make build, or pass -bin)", err)
	}
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	var out io.Writer
	if o.verbose {
		out = os.Stderr
	}
	d, err := daemontest.New(daemontest.Options{Parent: "sidecar-soak-" + hex.EncodeToString(rnd[:]), UIDFirst: 234000, UIDLast: 234999,
		Env: []string{"SIDECAR_MAX_LEASES=" + strconv.Itoa(2*o.leases), "SIDECAR_LOG_LEVEL=warn"}, Output: out})
	if err != nil {
		return nil, err
	}
	t := &target{client: d.Client, hc: daemontest.HTTPClient(d.CAFile, 10*time.Second), url: d.URL, token: d.Token, local: d}
	// A private copy of the binaries: a `make build` during a long soak must not swap
	// the daemon (or its sidecar-init helper) under it.
	if d.Bin, err = copyBinaries(bin, filepath.Join(d.StateDir, "bin")); err != nil {
		t.close()
		return nil, err
	}
	if err := d.Start(ctx); err != nil {
		t.close()
		return nil, fmt.Errorf("%w (run with -v to see its log)", err)
	}
	log.Info("daemon ready", "url", t.url, "pid", d.Pid())
	return t, nil
}

// close releases what an interrupted soak left, stops a daemon started here and removes
// its cgroup parent and state dir.
func (t *target) close() {
	if t.local != nil {
		if err := t.local.Close(true); err != nil {
			fmt.Fprintln(os.Stderr, "sidecar-soak:", err)
		}
	}
}

// copyBinaries copies the daemon and, when it sits next to it, sidecar-init into dir,
// and returns the copied daemon's path.
func copyBinaries(daemon, dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	for _, src := range []string{daemon, filepath.Join(filepath.Dir(daemon), "sidecar-init")} {
		b, err := os.ReadFile(src)
		if errors.Is(err, os.ErrNotExist) && src != daemon {
			continue // the daemon falls back to its own init
		}
		if err != nil {
			return "", err
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(src)), b, 0o755); err != nil {
			return "", err
		}
	}
	return filepath.Join(dir, filepath.Base(daemon)), nil
}
