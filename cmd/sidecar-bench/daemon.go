package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/daemontest"
	"github.com/sidecar-sandbox/sidecar/tls/tlsconfig"
)

// daemon is the sidecar daemon this run started.
type daemon struct {
	*daemontest.Binary
	logPath string
}

// startDaemon runs bin serve with strict isolation, self-signed TLS on a loopback port, a
// fresh token and state dir under dir, room for maxLeases leases with small default
// limits, and its own cgroup parent and uid range so it cannot collide with another
// daemon on the machine. It returns once the daemon answers.
func startDaemon(ctx context.Context, log *slog.Logger, bin, dir string, maxLeases int) (*daemon, error) {
	abs, err := filepath.Abs(bin)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(abs), "sidecar-init")); err != nil {
		return nil, fmt.Errorf("sidecar-init must sit next to %s (run make build): %w", abs, err)
	}
	d := &daemon{logPath: filepath.Join(dir, "daemon.log")}
	logFile, err := os.Create(d.logPath)
	if err != nil {
		return nil, err
	}
	// A uid block of its own, away from the default range other daemons use, big enough
	// for the lease-count curve's 1,000 leases held.
	uidFirst := 400000 + (os.Getpid()%50)*2000
	if d.Binary, err = daemontest.New(daemontest.Options{
		Bin: abs, Parent: fmt.Sprintf("sidecar-bench-%d", os.Getpid()), StateDir: filepath.Join(dir, "state"),
		UIDFirst: uidFirst, UIDLast: uidFirst + 1999, Output: logFile, KillWithParent: true,
		Env: []string{
			"PATH=" + os.Getenv("PATH"),
			"SIDECAR_WORK_ROOT=" + filepath.Join(dir, "leases"),
			"SIDECAR_MAX_LEASES=" + strconv.Itoa(max(maxLeases+16, 64)),
			"SIDECAR_DEFAULT_LIMITS_MEMORY_BYTES=" + strconv.Itoa(64<<20),
			"SIDECAR_DEFAULT_LIMITS_PIDS=64",
			"SCRIPT_ENABLED=true",
			"SIDECAR_LOG_LEVEL=warn",
		},
	}); err != nil {
		return nil, err
	}
	if err := d.Start(ctx); err != nil {
		_ = d.Close(false)
		return nil, fmt.Errorf("%w; its log: %s", err, tail(d.logPath, 2000))
	}
	// The daemon's first script worker compiles QuickJS as it starts: seconds of CPU with a
	// fresh state dir's empty compilation cache. One transform waits for it, so that no
	// case is measured beside it.
	if _, err := d.Client.RunScript(ctx, apitype.ScriptRequest{Source: transform, Input: map[string]any{"items": []any{}}}); err != nil {
		_ = d.Close(false)
		return nil, fmt.Errorf("the first transform: %w; the daemon's log: %s", err, tail(d.logPath, 2000))
	}
	log.Info("daemon up", "pid", d.Pid(), "url", d.URL, "log", d.logPath)
	return d, nil
}

// client is a shared-token client of the daemon. http1 forces HTTP/1.1 where the client
// would negotiate HTTP/2, to tell the protocol's cost from the daemon's.
func (d *daemon) client(http1 bool) (*client.Client, error) {
	if !http1 {
		return d.Client, nil
	}
	tlsConf, err := tlsconfig.Client(d.CAFile, "", "")
	if err != nil {
		return nil, err
	}
	tlsConf.NextProtos = []string{"http/1.1"}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = tlsConf
	t.ForceAttemptHTTP2 = false
	t.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{} // no h2
	t.MaxIdleConnsPerHost = 16
	t.WriteBufferSize, t.ReadBufferSize = 256<<10, 256<<10
	return client.New(client.Config{URL: d.URL, Token: d.Token, CAFile: d.CAFile, HTTPClient: &http.Client{Transport: t}})
}

// stop stops the daemon (SIGTERM, SIGKILL after 30 s) and removes its cgroup parent;
// its state dir goes with the run's directory.
func (d *daemon) stop(log *slog.Logger) {
	if err := d.Close(false); err != nil {
		log.Warn("daemon cleanup incomplete", "err", err)
	}
}

// status reads the daemon's memory and CPU from /proc.
func (d *daemon) status() daemontest.ProcStatus { return daemontest.ReadProcStatus(d.Pid()) }

// tail is the last n bytes of a log file.
func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
