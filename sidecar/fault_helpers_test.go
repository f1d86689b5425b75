package sidecar_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/sidecar/daemon"
	"github.com/sidecar-sandbox/sidecar/tls/certgen"
)

// binDaemon is the built `sidecar serve` running as a child process, so that a test can
// kill -9 it and start it again on the same state dir and port.
type binDaemon struct {
	t       *testing.T
	bin     string
	state   string
	addr    string
	parent  string // cgroup parent, unique per test
	caFile  string
	env     []string
	cmd     *exec.Cmd
	exited  chan struct{}
	stderr  *syncBuffer
	client  *client.Client
	starts  int
	running bool
}

// syncBuffer collects a child's stderr while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// faultName is the unique prefix of everything a fault test creates: its cgroup
// parent, its state dir and the markers in its processes' command lines. The pid keeps
// two runs of the suite at once (several engineers, one machine) apart: a daemon's
// startup sweep removes every cgroup under its parent that it does not know.
func faultName(t *testing.T) string {
	return "sidecar-fault-" + strings.ToLower(sanitize(t.Name())) + "-" + strconv.Itoa(os.Getpid())
}

// faultUIDs is a uid range of this test process's own, for the same reason.
func faultUIDs(base int) (first, last int) {
	first = base + os.Getpid()%1000*16
	return first, first + 15
}

// startFaultDaemon is startDaemon with the test process's own cgroup parent and uids.
func startFaultDaemon(t *testing.T, mods ...func(*daemon.Config)) *testDaemon {
	t.Helper()
	unique := func(c *daemon.Config) {
		c.CgroupParent = faultName(t)
		if c.UIDFirst != 0 {
			c.UIDFirst, c.UIDLast = faultUIDs(240000)
		}
	}
	return startDaemon(t, append([]func(*daemon.Config){unique}, mods...)...)
}

// freePort picks a loopback port for a daemon that must come back on the same address.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// newBinDaemon prepares (without starting) a daemon binary with its own state dir under
// /var/tmp, self-signed TLS, a fixed loopback port and a unique cgroup parent. extra
// are more KEY=VALUE settings. Cleanup releases every lease through the API, stops the
// daemon, and checks nothing of the test's stays behind.
func newBinDaemon(t *testing.T, extra ...string) *binDaemon {
	t.Helper()
	needRoot(t)
	bin := helperBinary(t)
	state, err := os.MkdirTemp("/var/tmp", faultName(t)+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeUnmounted(t, state) })
	certFile, _, _, err := certgen.EnsureSelfSigned(filepath.Join(state, "tls"), []string{"localhost", "127.0.0.1", "::1"})
	if err != nil {
		t.Fatal(err)
	}
	d := &binDaemon{t: t, bin: bin, state: state, addr: freePort(t), parent: faultName(t), caFile: certFile}
	uidFirst, uidLast := faultUIDs(256000)
	d.env = append([]string{
		"PATH=" + os.Getenv("PATH"),
		"SIDECAR_AUTH_TOKEN=" + testToken,
		"SIDECAR_STATE_DIR=" + state,
		"SIDECAR_TLS_SELF_SIGNED=true",
		"SIDECAR_LISTEN_ADDR=" + d.addr,
		"SIDECAR_CGROUP_PARENT=" + d.parent,
		fmt.Sprintf("SIDECAR_UID_RANGE=%d-%d", uidFirst, uidLast),
		"SIDECAR_ISOLATION=strict",
		"SCRIPT_ENABLED=false",
		"SIDECAR_LOG_LEVEL=debug",
	}, extra...)
	c, err := client.New(client.Config{URL: "https://" + d.addr, Token: testToken, CAFile: certFile})
	if err != nil {
		t.Fatal(err)
	}
	d.client = c
	t.Cleanup(d.cleanup)
	return d
}

// start runs `sidecar serve` and waits (bounded) until /healthz answers.
func (d *binDaemon) start() {
	d.t.Helper()
	if err := d.tryStart(); err != nil {
		d.t.Fatal(err)
	}
}

func (d *binDaemon) tryStart() error {
	d.starts++
	d.stderr = &syncBuffer{}
	cmd := exec.Command(d.bin, "serve")
	cmd.Env = d.env
	cmd.Stdout = d.stderr
	cmd.Stderr = d.stderr
	// Its own process group: a signal to the test never reaches it by accident.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	d.cmd, d.exited, d.running = cmd, make(chan struct{}), true
	go func(exited chan struct{}) { _ = cmd.Wait(); close(exited) }(d.exited)
	hc := d.httpClient(2 * time.Second)
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-d.exited:
			d.running = false
			return fmt.Errorf("sidecar serve (start %d) exited: %v\n%s", d.starts, cmd.ProcessState, d.stderr)
		default:
		}
		resp, err := hc.Get("https://" + d.addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			d.kill()
			return fmt.Errorf("sidecar serve did not answer /healthz within 60s:\n%s", d.stderr)
		}
		time.Sleep(50 * time.Millisecond) // poll interval, not a wait for a state
	}
}

// kill sends SIGKILL to the daemon (its pid only: lease processes live in their own
// sessions and cgroups) and reaps it.
func (d *binDaemon) kill() {
	if !d.running {
		return
	}
	_ = syscall.Kill(d.cmd.Process.Pid, syscall.SIGKILL)
	<-d.exited
	d.running = false
}

// stop asks the daemon to shut down and waits for it (bounded), killing it after that.
func (d *binDaemon) stop() {
	if !d.running {
		return
	}
	_ = syscall.Kill(d.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(30 * time.Second):
		d.t.Errorf("sidecar serve ignored SIGTERM for 30s; killing it\n%s", d.stderr)
		_ = syscall.Kill(d.cmd.Process.Pid, syscall.SIGKILL)
		<-d.exited
	}
	d.running = false
}

// cleanup releases every lease through the API (starting the daemon again if a test
// left it dead), stops it, and then checks that nothing the test made is left: no
// cgroup under its parent, no lease dir, no process with its marker.
func (d *binDaemon) cleanup() {
	t := d.t
	if !d.running {
		if err := d.tryStart(); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	}
	if d.running {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		if leases, err := d.client.List(ctx); err == nil {
			for _, l := range leases {
				if err := d.client.Release(ctx, l.ID); err != nil {
					t.Errorf("cleanup: release %s: %v", l.ID, err)
				}
			}
		} else {
			t.Errorf("cleanup: list leases: %v", err)
		}
		cancel()
		d.stop()
	}
	if left := d.cgroups(); len(left) > 0 {
		t.Errorf("cgroups left after every lease was released: %v", left)
	}
	if left := d.leaseDirs(); len(left) > 0 {
		t.Errorf("lease dirs left after every lease was released: %v", left)
	}
	if left := markedProcs(d.parent); len(left) > 0 {
		t.Errorf("processes left after every lease was released: %v", left)
	}
	for _, p := range cgroupParents(d.parent) {
		_ = syscall.Rmdir(p) // removes only an empty cgroup
	}
}

func (d *binDaemon) httpClient(timeout time.Duration) *http.Client {
	hc := (&testDaemon{t: d.t, caFile: d.caFile}).httpClient()
	hc.Timeout = timeout
	return hc
}

// raw sends one request to the binary daemon; see testDaemon.raw.
func (d *binDaemon) raw(method, path, token string, body io.Reader, hdr map[string]string) (int, http.Header, []byte) {
	td := &testDaemon{t: d.t, caFile: d.caFile, url: "https://" + d.addr}
	return td.raw(method, path, token, body, hdr)
}

func (d *binDaemon) workRoot() string { return filepath.Join(d.state, "leases") }

// leaseDirs lists what is left in the work root.
func (d *binDaemon) leaseDirs() []string { return leaseEntries(d.workRoot()) }

// leaseEntries lists a work root's lease directories: everything but the daemon's own
// dot entries (.disk holds lease filesystem images and the pool of ready ones).
func leaseEntries(workRoot string) []string {
	entries, _ := os.ReadDir(workRoot)
	var names []string
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".") {
			names = append(names, e.Name())
		}
	}
	return names
}

// cgroups lists the cgroups under the test's parent in every hierarchy.
func (d *binDaemon) cgroups() []string {
	var left []string
	for _, p := range cgroupParents(d.parent) {
		entries, _ := os.ReadDir(p)
		for _, e := range entries {
			if e.IsDir() {
				left = append(left, filepath.Join(p, e.Name()))
			}
		}
	}
	return left
}

func cgroupParents(parent string) []string {
	ps, _ := filepath.Glob("/sys/fs/cgroup/*/" + parent)
	if p := "/sys/fs/cgroup/" + parent; dirExists(p) {
		ps = append(ps, p)
	}
	return ps
}

func dirExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// markedProcs lists live processes (not zombies) whose command line holds marker.
func markedProcs(marker string) []string {
	entries, _ := os.ReadDir("/proc")
	var found []string
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !bytes.Contains(cmdline, []byte(marker)) {
			continue
		}
		found = append(found, fmt.Sprintf("%d %s", pid, bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '})))
	}
	return found
}

// waitFor polls cond every few milliseconds until it holds or the deadline passes.
func waitFor(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(5 * time.Millisecond) // poll interval
	}
}

// visibleIn walks a workdir (as root, never following links) and returns every path.
func visibleIn(t *testing.T, dir string) []string {
	t.Helper()
	var paths []string
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir {
			rel, _ := filepath.Rel(dir, p)
			paths = append(paths, rel)
		}
		return nil
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("walk %s: %v", dir, err)
	}
	return paths
}

// tempNames are the fsxfer temporaries among paths.
func tempNames(paths []string) []string {
	var tmp []string
	for _, p := range paths {
		if strings.HasPrefix(filepath.Base(p), ".sidecar-tmp-") {
			tmp = append(tmp, p)
		}
	}
	return tmp
}

// removeUnmounted removes a test's tree after checking that no mount lies inside it:
// RemoveAll through a mount would delete what the mount holds. Lease filesystems a failed
// test left mounted are unmounted first (lazily; their loop devices clear themselves).
func removeUnmounted(t testing.TB, dir string) {
	for _, m := range mountsUnder(dir) {
		_ = syscall.Unmount(m, syscall.MNT_DETACH)
	}
	info, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		t.Errorf("read mountinfo: %v", err)
		return
	}
	for line := range strings.SplitSeq(string(info), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			t.Errorf("not removing %s: %s is still mounted", dir, f[4])
			return
		}
	}
	_ = os.RemoveAll(dir)
}

// pattern is a seekable, deterministic, incompressible stream of size bytes: what a
// large upload sends without holding it in memory.
type pattern struct {
	size, pos int64
	seed      uint64
}

func (p *pattern) Read(b []byte) (int, error) {
	if p.pos >= p.size {
		return 0, io.EOF
	}
	n := int(min(int64(len(b)), p.size-p.pos))
	var word [8]byte
	for i := 0; i < n; {
		w := (p.pos + int64(i)) / 8
		binary.LittleEndian.PutUint64(word[:], splitmix(p.seed^uint64(w)))
		k := copy(b[i:n], word[(p.pos+int64(i))%8:])
		i += k
	}
	p.pos += int64(n)
	return n, nil
}

func (p *pattern) Seek(off int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		off += p.pos
	case io.SeekEnd:
		off += p.size
	}
	if off < 0 {
		return 0, errors.New("negative seek")
	}
	p.pos = off
	return off, nil
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

func sha256Of(t *testing.T, r io.Reader) [32]byte {
	t.Helper()
	h := sha256.New()
	if _, err := io.CopyBuffer(h, r, make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	var s [32]byte
	copy(s[:], h.Sum(nil))
	return s
}

// gate passes reads through until pos bytes went by, then tells reached and blocks
// until open is closed (or the test ends). It pauses a body at a chosen byte.
type gate struct {
	io.ReadSeeker
	at      int64
	pos     int64
	once    sync.Once
	reached chan struct{}
	open    chan struct{}
}

func newGate(r io.ReadSeeker, at int64) *gate {
	return &gate{ReadSeeker: r, at: at, reached: make(chan struct{}), open: make(chan struct{})}
}

func (g *gate) Read(b []byte) (int, error) {
	if g.pos >= g.at {
		g.once.Do(func() { close(g.reached) })
		<-g.open
	} else if rem := g.at - g.pos; int64(len(b)) > rem {
		b = b[:rem]
	}
	n, err := g.ReadSeeker.Read(b)
	g.pos += int64(n)
	return n, err
}

func (g *gate) Seek(off int64, whence int) (int64, error) {
	n, err := g.ReadSeeker.Seek(off, whence)
	if err == nil {
		g.pos = n
	}
	return n, err
}
