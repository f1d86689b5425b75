package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/tls/certgen"
)

// target is the daemon under soak: one this program started, or a remote one.
type target struct {
	client *client.Client
	hc     *http.Client // for /metrics
	url    string
	token  string

	// Set only for a daemon started here.
	cmd      *exec.Cmd
	exited   chan struct{}
	state    string
	parent   string // cgroup parent
	uidFirst int
	uidLast  int
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
		return &target{client: c, url: cfg.URL, token: cfg.Token, hc: tlsClient(cfg.CAFile)}, nil
	}
	return startDaemon(ctx, o, log)
}

// startDaemon runs the built daemon with its own state dir, port and cgroup parent.
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
	// Under /var/tmp, not /tmp: a lease's private /tmp would hide a work root there.
	state, err := os.MkdirTemp("/var/tmp", "sidecar-soak-")
	if err != nil {
		return nil, err
	}
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	t := &target{state: state, parent: "sidecar-soak-" + hex.EncodeToString(rnd[:]), uidFirst: 234000, uidLast: 234999, exited: make(chan struct{})}
	// The hosts `sidecar serve` asks for, so that it keeps this certificate.
	certFile, _, _, err := certgen.EnsureSelfSigned(filepath.Join(state, "tls"), []string{"localhost", "127.0.0.1", "::1"})
	if err != nil {
		t.removeState()
		return nil, err
	}
	addr, err := freePort()
	if err != nil {
		t.removeState()
		return nil, err
	}
	// A private copy of the binaries: a `make build` during a long soak must not swap
	// the daemon (or its sidecar-init helper) under it.
	if bin, err = copyBinaries(bin, filepath.Join(state, "bin")); err != nil {
		t.removeState()
		return nil, err
	}
	t.token = strings.Repeat("s", 8) + hex.EncodeToString(rnd[:]) + strings.Repeat("k", 32)
	t.url = "https://" + addr
	t.cmd = exec.Command(bin, "serve")
	t.cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"SIDECAR_AUTH_TOKEN=" + t.token,
		"SIDECAR_STATE_DIR=" + state,
		"SIDECAR_TLS_SELF_SIGNED=true",
		"SIDECAR_LISTEN_ADDR=" + addr,
		"SIDECAR_CGROUP_PARENT=" + t.parent,
		fmt.Sprintf("SIDECAR_UID_RANGE=%d-%d", t.uidFirst, t.uidLast),
		"SIDECAR_ISOLATION=strict",
		"SIDECAR_MAX_LEASES=" + strconv.Itoa(2*o.leases),
		"SCRIPT_ENABLED=false",
		"SIDECAR_LOG_LEVEL=warn",
	}
	if o.verbose {
		t.cmd.Stderr = os.Stderr
	}
	t.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := t.cmd.Start(); err != nil {
		t.removeState()
		return nil, err
	}
	go func() { _ = t.cmd.Wait(); close(t.exited) }()
	t.hc = tlsClient(certFile)
	if t.client, err = client.New(client.Config{URL: t.url, Token: t.token, CAFile: certFile}); err != nil {
		t.close()
		return nil, err
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-t.exited:
			t.removeState()
			return nil, fmt.Errorf("the daemon exited at start: %v (run with -v to see its log)", t.cmd.ProcessState)
		case <-ctx.Done():
			t.close()
			return nil, ctx.Err()
		default:
		}
		if resp, err := t.hc.Get(t.url + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				log.Info("daemon ready", "url", t.url, "pid", t.cmd.Process.Pid)
				return t, nil
			}
		}
		if time.Now().After(deadline) {
			t.close()
			return nil, errors.New("the daemon did not answer /healthz within 60s")
		}
		time.Sleep(100 * time.Millisecond) // poll interval
	}
}

func (t *target) local() bool { return t.cmd != nil }

// pid is the daemon's, or 0 for a remote one.
func (t *target) pid() int {
	if t.cmd == nil {
		return 0
	}
	return t.cmd.Process.Pid
}

// close releases what an interrupted soak left (leases survive a daemon's stop by
// design, and their cgroups would outlive the state dir), stops a daemon started here
// (SIGTERM, then SIGKILL after 30 s), and removes its cgroup parent and state dir.
func (t *target) close() {
	if t.cmd == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if leases, err := t.client.List(ctx); err == nil {
		for _, l := range leases {
			if err := t.client.Release(ctx, l.ID); err != nil {
				fmt.Fprintf(os.Stderr, "sidecar-soak: release %s: %v\n", l.ID, err)
			}
		}
	}
	_ = syscall.Kill(t.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-t.exited:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(t.cmd.Process.Pid, syscall.SIGKILL)
		<-t.exited
	}
	for _, p := range cgroupParents(t.parent) {
		if err := syscall.Rmdir(p); err != nil && !errors.Is(err, syscall.ENOENT) {
			fmt.Fprintf(os.Stderr, "sidecar-soak: cgroup %s left: %v\n", p, err)
		}
	}
	t.removeState()
}

// removeState removes the state dir unless a mount lies inside it.
func (t *target) removeState() {
	info, _ := os.ReadFile("/proc/self/mountinfo")
	for line := range strings.SplitSeq(string(info), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], t.state+"/") {
			fmt.Fprintf(os.Stderr, "sidecar-soak: not removing %s: %s is mounted\n", t.state, f[4])
			return
		}
	}
	_ = os.RemoveAll(t.state)
}

func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
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
