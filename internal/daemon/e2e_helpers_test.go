package daemon_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/daemon"
	"github.com/sidecar-sandbox/sidecar/internal/daemontest"
	"github.com/sidecar-sandbox/sidecar/internal/sandbox"
	"github.com/sidecar-sandbox/sidecar/internal/script"
	"github.com/sidecar-sandbox/sidecar/internal/testtool"
	"github.com/sidecar-sandbox/sidecar/lease"
	"github.com/sidecar-sandbox/sidecar/tls/certgen"
	"github.com/sidecar-sandbox/sidecar/tls/tlsconfig"
)

// TestMain lets the test binary stand in for the daemon's binary: the sandbox and script
// helpers re-execute os.Executable() with a hidden subcommand.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "__sandbox-init":
			sandbox.InitMain()
		case "__script-worker":
			script.WorkerMain()
		}
	}
	code := m.Run()
	if helperDir != "" {
		os.RemoveAll(helperDir)
	}
	os.Exit(code)
}

var (
	helperOnce sync.Once
	helperDir  string
	helperPath string
	helperErr  error
)

// helperBinary is the real daemon binary and its sidecar-init helper, built once by
// `make build` (as deployed: no race detector, whose memory overhead would trip the script
// workers' bound) into a directory that the unprivileged script worker uid can execute
// from (go test's build dir is root's only).
func helperBinary(t testing.TB) string {
	t.Helper()
	helperOnce.Do(func() {
		// The VM tests (test/vm) boot without Go or make: they ship the binaries built.
		if dir := os.Getenv(prebuiltEnv); dir != "" {
			helperPath = filepath.Join(dir, "sidecar")
			_, helperErr = os.Stat(helperPath)
			return
		}
		if helperDir, helperErr = os.MkdirTemp("/var/tmp", "sidecar-e2e-bin-"); helperErr != nil {
			return
		}
		if helperErr = os.Chmod(helperDir, 0o755); helperErr != nil {
			return
		}
		helperPath = filepath.Join(helperDir, "sidecar")
		out, err := exec.Command("make", "-C", "../..", "build", "BINDIR="+helperDir).CombinedOutput()
		if err != nil {
			helperErr = fmt.Errorf("make build: %v\n%s", err, out)
		}
	})
	if helperErr != nil {
		t.Fatal(helperErr)
	}
	return helperPath
}

// prebuiltEnv names a directory holding a built sidecar and sidecar-init to use instead
// of building them.
const prebuiltEnv = "SIDECAR_TEST_PREBUILT"

const testToken = "test-shared-token-0123456789abcdefghijklmnop"

// fakeClock is the lease clock, moved by tests instead of sleeping.
type fakeClock struct {
	mu     sync.Mutex
	offset time.Duration
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset)
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.offset += d
	c.mu.Unlock()
}

// testDaemon is a real daemon on a loopback port with real TLS.
type testDaemon struct {
	*daemon.Daemon
	t     testing.TB
	cfg   daemon.Config
	clock *fakeClock
	// contract validates every reply the test's clients receive against docs/openapi.yaml.
	contract *contractValidator
	url      string
	caFile   string
	keyFile  string
	client   *client.Client
	// clients: every client newClient made, whose kept-alive connections stop closes
	// first: the daemon's graceful shutdown waits up to a second for an HTTP/2 client to
	// hang up after its GOAWAY, a second added to every test.
	clientsMu sync.Mutex
	clients   []*client.Client
}

// isolation is what the tests can have here: full isolation as root (CI), none otherwise.
func isolation() string {
	if os.Geteuid() == 0 {
		return "strict"
	}
	return "none"
}

// needPython skips (fails under SIDECAR_TEST_REQUIRE_ALL=1) without /usr/bin/python3,
// which the test runs inside a lease to probe it.
func needPython(t testing.TB) {
	t.Helper()
	testtool.Need(t, "/usr/bin/python3", "python3", "the test runs it inside a lease")
}

// quotaEnv is the disk quota setting of the tests' daemons: none (the default, auto: a
// loop filesystem per lease) where mkfs.ext4 is installed or SIDECAR_TEST_REQUIRE_ALL=1
// (CI) asks for it; else SIDECAR_DISK_QUOTA=off, since auto refuses to start in strict
// isolation without e2fsprogs and only the tests of the quota itself (needMkfs) need it.
func quotaEnv() []string {
	if _, ok := testtool.Find("mkfs.ext4"); ok || testtool.RequireAll() {
		return nil
	}
	return []string{"SIDECAR_DISK_QUOTA=off"}
}

// needMkfs skips (fails under SIDECAR_TEST_REQUIRE_ALL=1) without mkfs.ext4, which the
// daemon formats each lease's filesystem with.
func needMkfs(t testing.TB) {
	t.Helper()
	testtool.Need(t, "mkfs.ext4", "e2fsprogs", "the daemon formats each lease's filesystem with it (SIDECAR_DISK_QUOTA=loop)")
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for cgroups, uid switching and namespaces (CI runs as root)")
	}
}

// startDaemon starts a daemon with its own state dir and TLS pair. mods adjust the config.
func startDaemon(t testing.TB, mods ...func(*daemon.Config)) *testDaemon {
	t.Helper()
	d := newTestDaemon(t, mods...)
	d.start()
	t.Cleanup(d.cleanup)
	return d
}

// newTestDaemon is startDaemon's daemon, configured and not started.
func newTestDaemon(t testing.TB, mods ...func(*daemon.Config)) *testDaemon {
	t.Helper()
	state := stateDir(t)
	certFile, keyFile, _, err := certgen.EnsureSelfSigned(filepath.Join(state, "tls"), []string{"127.0.0.1", "localhost"})
	if err != nil {
		t.Fatal(err)
	}
	cfg := daemon.Config{
		Version:       "test",
		SharedToken:   testToken,
		ListenAddr:    "127.0.0.1:0",
		StateDir:      state,
		WorkRoot:      filepath.Join(state, "leases"),
		MaxLeases:     8,
		DefaultTTL:    time.Minute,
		MaxTTL:        time.Hour,
		DefaultLimits: lease.Limits{MemoryBytes: 256 << 20, CPUMillicores: 1000, Pids: 128, DiskBytes: 256 << 20},
		MaxLimits:     lease.Limits{MemoryBytes: 1 << 30, CPUMillicores: 2000, Pids: 1024, DiskBytes: 4 << 30},
		UIDFirst:      0,
		UIDLast:       0,
		// The pid keeps concurrent runs of the suite out of each other's cgroups (a
		// daemon's startup sweep removes lease cgroups it does not know).
		CgroupParent:      fmt.Sprintf("sidecar-test-%d-%s", os.Getpid(), strings.ToLower(sanitize(t.Name()))),
		Isolation:         isolation(),
		MaxOutputBytes:    1 << 20,
		OutputBufferBytes: 1 << 20,
		MaxProcesses:      16,
		ScriptEnabled:     false,
		ReapInterval:      time.Hour, // tests reap explicitly
		Logger:            slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if os.Geteuid() == 0 {
		cfg.UIDFirst, cfg.UIDLast = 231000, 231999
	}
	if testing.Verbose() {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if len(quotaEnv()) > 0 {
		cfg.DiskQuota = "off"
	}
	for _, m := range mods {
		m(&cfg)
	}
	// Lease processes start through the deployed helper chain, not through this test
	// binary (whose start-up is much heavier than the daemon's).
	cfg.HelperPath = helperBinary(t)
	return &testDaemon{t: t, cfg: cfg, clock: &fakeClock{}, caFile: certFile, keyFile: keyFile, contract: newContractValidator(t)}
}

// cleanup releases every lease the test left (killing their processes, removing their
// cgroups and workdirs), stops the daemon, and removes the test's now-empty cgroup parent.
func (d *testDaemon) cleanup() {
	if d.Daemon != nil {
		ctx := context.Background()
		if leases, err := d.client.List(ctx); err == nil {
			for _, l := range leases {
				_ = d.client.Release(ctx, l.ID)
			}
		}
	}
	d.stop()
	_ = daemontest.RemoveCgroupParent(d.cfg.CgroupParent)
}

// stateDir is a fresh state dir outside /tmp: a lease's private /tmp is mounted over
// /tmp, so a work root under it would be hidden from the lease. The daemon mounts the
// leases' devpts instances under <state>/pts and unmounts them when it stops; lease
// filesystems (loop mounts on lease directories) a failed test left are unmounted before
// the tree goes (removeUnmounted), and anything still mounted keeps the tree, with an error.
func stateDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("/var/tmp", "sidecar-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeUnmounted(t, dir) })
	return dir
}

func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, s)
}

func (d *testDaemon) start() {
	d.t.Helper()
	if err := d.tryStart(); err != nil {
		d.t.Fatalf("start daemon: %v", err)
	}
}

// tryStart starts the daemon, or returns why it did not.
func (d *testDaemon) tryStart() error {
	t := d.t
	t.Helper()
	reloader, err := tlsconfig.NewReloader(d.caFile, d.keyFile, d.cfg.Logger)
	if err != nil {
		t.Fatal(err)
	}
	d.cfg.TLS, err = tlsconfig.Server(reloader, "")
	if err != nil {
		t.Fatal(err)
	}
	d.cfg.Now = d.clock.Now
	dd, err := daemon.Start(context.Background(), d.cfg)
	if err != nil {
		return err
	}
	d.Daemon = dd
	d.url = "https://" + dd.Addr().String()
	d.client = d.newClient(d.cfg.SharedToken)
	return nil
}

func (d *testDaemon) stop() {
	if d.Daemon != nil {
		d.clientsMu.Lock()
		for _, c := range d.clients {
			c.CloseIdleConnections()
		}
		d.clientsMu.Unlock()
		_ = d.Daemon.Close(context.Background())
		d.Daemon = nil
	}
}

// restart stops the daemon and starts a new one on the same state dir; mods change the
// config (e.g. rotate the token).
func (d *testDaemon) restart(mods ...func(*daemon.Config)) {
	d.t.Helper()
	d.stop()
	d.cfg.ListenAddr = "127.0.0.1:0"
	for _, m := range mods {
		m(&d.cfg)
	}
	d.start()
}

func (d *testDaemon) newClient(token string) *client.Client {
	d.t.Helper()
	c, err := client.New(client.Config{URL: d.url, Token: token, CAFile: d.caFile, WrapTransport: d.contract.wrap})
	if err != nil {
		d.t.Fatal(err)
	}
	d.clientsMu.Lock()
	d.clients = append(d.clients, c)
	d.clientsMu.Unlock()
	return c
}

// acquire takes a lease through the client and releases it when the test ends.
func (d *testDaemon) acquire(session string) *client.Lease {
	d.t.Helper()
	l, err := d.client.Acquire(context.Background(), apitype.AcquireRequest{SessionID: session})
	if err != nil {
		d.t.Fatalf("acquire %s: %v", session, err)
	}
	d.t.Cleanup(func() { _ = l.Release(context.Background()) })
	return l
}

// acquireOnce takes a lease without background renewal (the test owns the clock) and
// does not release it.
func (d *testDaemon) acquireOnce(req apitype.AcquireRequest) *client.Lease {
	d.t.Helper()
	l, err := d.client.Acquire(context.Background(), req)
	if err != nil {
		d.t.Fatalf("acquire %s: %v", req.SessionID, err)
	}
	l.StopRenewing()
	return l
}

// httpClient is a raw HTTPS client trusting the daemon's certificate, for requests the
// Go client would never send.
func (d *testDaemon) httpClient() *http.Client {
	pem, err := os.ReadFile(d.caFile)
	if err != nil {
		d.t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	return &http.Client{Timeout: 30 * time.Second, Transport: d.contract.wrap(&http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}})}
}

// raw sends one request and returns status, headers and body.
func (d *testDaemon) raw(method, path, token string, body io.Reader, hdr map[string]string) (int, http.Header, []byte) {
	d.t.Helper()
	req, err := http.NewRequest(method, d.url+path, body)
	if err != nil {
		d.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := d.httpClient().Do(req)
	if err != nil {
		d.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

// wantProblem asserts a problem+json reply with the given status and code.
func wantProblem(t *testing.T, status int, hdr http.Header, body []byte, wantStatus int, wantCode string) {
	t.Helper()
	if status != wantStatus {
		t.Fatalf("status %d, want %d; body %s", status, wantStatus, body)
	}
	if ct := hdr.Get("Content-Type"); ct != apitype.ProblemContentType {
		t.Fatalf("Content-Type %q, want problem+json; body %s", ct, body)
	}
	var p apitype.Problem
	if err := json.Unmarshal(body, &p); err != nil {
		t.Fatalf("problem body: %v: %s", err, body)
	}
	if p.Code != wantCode || p.Status != wantStatus {
		t.Fatalf("problem %+v, want code %s", p, wantCode)
	}
	if bytes.Contains(body, []byte(testToken)) {
		t.Fatalf("error body echoes the shared token: %s", body)
	}
}

func jsonBody(v any) io.Reader {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return bytes.NewReader(b)
}

// must turns (v, err) into v, failing the test on err: must(l.Exec(ctx, req))(t).
func must[T any](v T, err error) func(*testing.T) T {
	return func(t *testing.T) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}
