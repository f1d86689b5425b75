package daemon_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/internal/daemon"
	"github.com/sidecar-sandbox/sidecar/internal/daemontest"
	"github.com/sidecar-sandbox/sidecar/internal/testtool"
)

// binDaemon is the built `sidecar serve` running as a child process (the harness the
// bench and the soak use too), so that a test can kill -9 it and start it again on the
// same state dir and port.
type binDaemon struct {
	*daemontest.Binary
	t      *testing.T
	state  string
	addr   string
	parent string // cgroup parent, unique per test
	caFile string
	stderr *testtool.Buffer
	client *client.Client
	starts int
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

// newBinDaemon prepares (without starting) a daemon binary with its own state dir under
// /var/tmp, self-signed TLS, a fixed loopback port and a unique cgroup parent. extra
// are more KEY=VALUE settings. Cleanup releases every lease through the API, stops the
// daemon, and checks nothing of the test's stays behind.
func newBinDaemon(t *testing.T, extra ...string) *binDaemon {
	t.Helper()
	needRoot(t)
	uidFirst, uidLast := faultUIDs(256000)
	stderr := &testtool.Buffer{}
	b, err := daemontest.New(daemontest.Options{Bin: helperBinary(t), Parent: faultName(t), Token: testToken,
		UIDFirst: uidFirst, UIDLast: uidLast, Env: append(append([]string{"SIDECAR_LOG_LEVEL=debug"}, quotaEnv()...), extra...), Output: stderr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeUnmounted(t, b.StateDir) })
	d := &binDaemon{Binary: b, t: t, state: b.StateDir, addr: b.Addr, parent: b.Parent, caFile: b.CAFile, stderr: stderr, client: b.Client}
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
	d.stderr.Reset() // this start's output only
	if err := d.Start(context.Background()); err != nil {
		return fmt.Errorf("start %d: %w\n%s", d.starts, err, d.stderr)
	}
	return nil
}

func (d *binDaemon) kill() { d.Kill() }

// stop asks the daemon to shut down and waits for it (bounded), killing it after that.
func (d *binDaemon) stop() {
	if err := d.Stop(); err != nil {
		d.t.Errorf("%v\n%s", err, d.stderr)
	}
}

func (d *binDaemon) httpClient(timeout time.Duration) *http.Client {
	return daemontest.HTTPClient(d.caFile, timeout)
}

// cleanup releases every lease through the API (starting the daemon again if a test
// left it dead), stops it, and then checks that nothing the test made is left: no
// cgroup under its parent, no lease dir, no process with its marker.
func (d *binDaemon) cleanup() {
	t := d.t
	if !d.Running() {
		if err := d.tryStart(); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	}
	if d.Running() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		if err := d.ReleaseAll(ctx); err != nil {
			t.Errorf("cleanup: %v", err)
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
	_ = daemontest.RemoveCgroupParent(d.parent)
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
	for _, p := range daemontest.CgroupParents(d.parent) {
		entries, _ := os.ReadDir(p)
		for _, e := range entries {
			if e.IsDir() {
				left = append(left, filepath.Join(p, e.Name()))
			}
		}
	}
	return left
}

// waitRetired waits for released leases' directories under workRoot to go: release
// answers once their processes are killed, and right after waits for their exits, removes
// their cgroups, filesystems and, last, directories.
func waitRetired(t testing.TB, workRoot string, ids ...string) {
	t.Helper()
	waitFor(t, "the released leases' directories to be removed", 10*time.Second, func() bool {
		return !slices.ContainsFunc(ids, func(id string) bool { return dirExists(filepath.Join(workRoot, id)) })
	})
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

var waitFor = testtool.WaitFor

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
	for _, m := range daemontest.MountsUnder(dir) {
		if m != dir {
			_ = syscall.Unmount(m, syscall.MNT_DETACH)
		}
	}
	if err := daemontest.RemoveTree(dir); err != nil {
		t.Errorf("%v", err)
	}
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
