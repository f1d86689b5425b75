package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/internal/confine"
	"github.com/sidecar-sandbox/sidecar/internal/testtool"
)

// The main goroutine keeps the main thread, so a test goroutine that unshares a namespace
// on a locked thread and ends never wedges the main thread in it: /proc/self shows the
// main thread's namespaces, which the namespace tests compare against.
func init() { runtime.LockOSThread() }

// The test binary is its own helper (`<test binary> __sandbox-init`) and, like the
// daemon, the subreaper of orphaned lease processes.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == HelperArg {
		InitMain()
	}
	if len(os.Args) > 1 && os.Args[1] == probeArg {
		os.Exit(probeMain(os.Args[2:]))
	}
	// The tests write their fixtures with the modes they mean, whatever umask they were
	// started with (UMask=0077 in the VM's systemd variant, which runs them with the
	// unit's settings; the daemon's own suite keeps it).
	syscall.Umask(0o022)
	ctx, stop := context.WithCancel(context.Background())
	if os.Geteuid() == 0 {
		if err := confine.BecomeSubreaper(); err != nil {
			panic(err)
		}
		go confine.RunReaper(ctx, slog.New(slog.DiscardHandler))
	}
	cleanup := buildHelpers()
	code := m.Run()
	cleanup()
	stop()
	confine.RemoveEmptyParent(testCgroupParent) // the shared test parent, empty by now
	os.Exit(code)
}

// cgroupDir is the directory of a lease's cgroup (parts: lease id, child) for controller
// ctrl: one hierarchy per controller on v1, one for all on v2.
func cgroupDir(s *Sandbox, ctrl string, parts ...string) string {
	if s.cg == nil {
		panic("sandbox without cgroups")
	}
	return s.cg.Dir(ctrl, parts...)
}

// cgroupDirs are the directories of a lease's cgroup in every hierarchy.
func cgroupDirs(s *Sandbox, parts ...string) []string {
	var dirs []string
	for _, ctrl := range v1Controllers {
		if d := cgroupDir(s, ctrl, parts...); !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	return dirs
}

const testCgroupParent = "sidecar-test"

// needPython skips (fails under SIDECAR_TEST_REQUIRE_ALL=1) without /usr/bin/python3,
// which the test runs inside a lease to probe it.
func needPython(t testing.TB) {
	t.Helper()
	testtool.Need(t, "/usr/bin/python3", "python3", "the test runs it inside a lease")
}

// newTestSandbox is a strict sandbox with the Go helper; it skips unless the test runs as
// root on a host with cgroups and Landlock (CI does).
func newTestSandbox(t testing.TB) *Sandbox {
	t.Helper()
	return newTestSandboxWith(t, goHelperPath(t))
}

func newTestSandboxWith(t testing.TB, helper string) *Sandbox {
	t.Helper()
	return newTestSandboxConfig(t, Config{HelperPath: helper})
}

// newTestSandboxConfig is a strict sandbox configured by cfg, on the test cgroup parent
// unless cfg names another.
func newTestSandboxConfig(t testing.TB, cfg Config) *Sandbox {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: strict isolation (cgroups, uid switching, mounts); CI runs as root")
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = testCgroupParent
	}
	// One directory holds the PTY instances, user files and lease directories (newTestLease)
	// as the daemon's state dir and work root hold them: a mount point the helpers detach.
	// Not under /tmp (leases hide it); emptied with Remove, never RemoveAll: a mount left
	// there fails the test instead of being walked into.
	root, err := os.MkdirTemp("/var/tmp", "sidecar-sbx-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(root, 0o711) // lease uids traverse it to reach their own 0700 dirs
	dirs := []string{root}
	if cfg.PTYRoot == "" {
		cfg.PTYRoot = filepath.Join(root, "pts")
	} else {
		dirs = append(dirs, cfg.PTYRoot)
	}
	if cfg.UserRoot == "" {
		cfg.UserRoot = filepath.Join(root, "users")
	}
	leases := filepath.Join(root, "leases")
	if err := os.Mkdir(leases, 0o711); err != nil {
		t.Fatal(err)
	}
	roots, err := BindMountRoots(dirs, root+".mount-roots", slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	cfg.DetachRoots = roots.Dirs()
	// None in a chroot (make fresh-test): its helpers copy the daemon's namespace.
	if cfg.HelperMountNS, err = roots.HelperMountNS(); err != nil && !errors.Is(err, errChrooted) {
		t.Fatal(err)
	}
	remove := func() {
		cfg.HelperMountNS.Close()
		for _, d := range []string{cfg.PTYRoot, cfg.UserRoot, leases, root} {
			if err := os.Remove(d); err != nil && !os.IsNotExist(err) {
				t.Errorf("after Close: %v", err) // empty by now: Retire removes each lease's files
			}
		}
	}
	s, err := New(cfg)
	if err != nil {
		roots.Close()
		remove()
		t.Fatalf("New: %v", err)
	}
	testLeaseDirs.Store(s, leases)
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Sandbox.Close: %v", err)
		}
		if err := roots.Close(); err != nil {
			t.Errorf("MountRoots.Close: %v", err)
		}
		remove()
		testLeaseDirs.Delete(s)
	})
	return s
}

// testLeaseDirs maps a sandbox of newTestSandboxConfig to where its test leases' directories
// go: under its mount root, as the daemon's work root is.
var testLeaseDirs sync.Map

// settle waits for the background cgroup work (spares, removals) of s's leases.
func (s *Sandbox) settle() {
	s.mu.Lock()
	les := slices.Collect(maps.Values(s.leases))
	s.mu.Unlock()
	for _, le := range les {
		s.eng.Settle(le.spec.ID)
	}
}

var nonID = regexp.MustCompile(`[^A-Za-z0-9]+`)

func mustExecutable(t testing.TB) string {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return self
}

// newTestLease provisions a lease with a unique id and uid; t.Cleanup tears it down and
// removes its directories.
func newTestLease(t testing.TB, s *Sandbox, mod func(*LeaseSpec)) LeaseSpec {
	t.Helper()
	return newTestLeaseAs(t, s, mod)
}

func newTestLeaseAs(t testing.TB, s *Sandbox, mod func(*LeaseSpec)) LeaseSpec {
	t.Helper()
	parent := "/var/tmp" // not /tmp: the lease's own /tmp hides it
	if d, ok := testLeaseDirs.Load(s); ok {
		parent = d.(string)
	}
	base, err := os.MkdirTemp(parent, "sidecar-sandbox-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(base, 0o711) // lease uids traverse it to reach their own 0700 dirs
	n := rand.IntN(60000)
	name := nonID.ReplaceAllString(t.Name(), "-")
	if len(name) > 80 {
		name = name[:80]
	}
	l := LeaseSpec{
		ID:      fmt.Sprintf("t-%s-%d", name, n),
		UID:     300000 + n,
		GID:     300000 + n,
		Workdir: filepath.Join(base, "work"),
		TmpDir:  filepath.Join(base, "tmp"),
	}
	for _, d := range []string{l.Workdir, l.TmpDir} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if mod != nil {
		mod(&l)
	}
	t.Cleanup(func() {
		if err := s.Teardown(context.Background(), l.ID); err != nil {
			t.Errorf("Teardown: %v", err)
		}
		if err := s.Retire(context.Background(), l.ID); err != nil {
			t.Errorf("Retire: %v", err)
		}
		os.RemoveAll(base) // no mount points: /tmp binds live in the helpers' namespaces
	})
	if err := s.Provision(context.Background(), l); err != nil {
		t.Fatalf("Provision: %v", err)
	}
	return l
}

type result struct {
	stdout, stderr string
	exitCode       int
	signaled       bool
	oom            bool
	cgroup         string // the command's child cgroup
}

// run runs argv in the lease to completion.
func run(t testing.TB, s *Sandbox, leaseID string, spec Spec) result {
	t.Helper()
	cmd, tr, err := s.Command(leaseID, spec)
	if err != nil {
		t.Fatalf("Command(%q): %v", spec.Argv, err)
	}
	return runPrepared(t, cmd, tr)
}

// runPrepared starts a command made by Command, waits for it and closes its tree.
func runPrepared(t testing.TB, cmd *exec.Cmd, tr Tree) result {
	t.Helper()
	spec := Spec{Argv: cmd.Args}
	defer tr.Close()
	// Pipes of its own, as package process has: a launcher can take those.
	var stdout, stderr bytes.Buffer
	var copying sync.WaitGroup
	for _, o := range []struct {
		dst *bytes.Buffer
		fd  *io.Writer
	}{{&stdout, &cmd.Stdout}, {&stderr, &cmd.Stderr}} {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		*o.fd = w
		defer w.Close()
		copying.Go(func() { o.dst.ReadFrom(r); r.Close() })
	}
	err := tr.Start()
	cmd.Stdout.(*os.File).Close()
	cmd.Stderr.(*os.File).Close()
	if err != nil {
		copying.Wait()
		t.Fatalf("Start(%q): %v", spec.Argv, err)
	}
	err = cmd.Wait()
	copying.Wait() // as exec.Cmd waits for its copying
	r := result{stdout: stdout.String(), stderr: stderr.String(), oom: tr.OOMKilled(), cgroup: treeCgroup(tr)}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		r.exitCode = ee.ExitCode()
		r.signaled = ee.ExitCode() == -1
	} else if err != nil {
		t.Fatalf("Wait(%q): %v", spec.Argv, err)
	}
	return r
}

func sh(script string) Spec { return Spec{Argv: []string{"/bin/sh", "-c", script}} }

func lines(s string) []string { return strings.Split(strings.TrimSpace(s), "\n") }

// runTTY starts cmd on a PTY of the lease's (as package process does) and returns what it
// wrote until it exited.
func runTTY(t *testing.T, s *Sandbox, leaseID string, cmd *exec.Cmd, tr Tree) string {
	t.Helper()
	master, slave, err := s.OpenPTY(leaseID)
	if err != nil {
		t.Fatalf("OpenPTY: %v", err)
	}
	defer master.Close()
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr.Setctty, cmd.SysProcAttr.Ctty = true, 0
	err = tr.Start()
	slave.Close()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	io.Copy(&out, master) // ends with EIO once the command exits
	cmd.Wait()
	return out.String()
}

// treeCgroup is the child cgroup of a tree Command returned.
func treeCgroup(tr Tree) string { return tr.(interface{ Cgroup() string }).Cgroup() }

// v1Controllers are the hierarchies a lease process joins on cgroup v1.
var v1Controllers = []string{"memory", "cpu", "cpuacct", "pids", "freezer"}

// pollUntil calls done every millisecond until it reports true, the timeout passes or
// ctx ends.
func pollUntil(ctx context.Context, timeout time.Duration, done func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		ok, err := done()
		if ok || err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}
