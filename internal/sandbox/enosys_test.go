package sandbox

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// enosysEnv marks the child process a test runs itself in under underENOSYS.
const enosysEnv = "SIDECAR_TEST_ENOSYS"

// underENOSYS runs the calling test again in a child process whose seccomp filter answers
// the system call nr with ENOSYS, as systemd's filters do for some unit settings (with
// no_new_privs, as the unit sets it): a filter binds a process for good. It reports
// whether this is that child, which goes on with the test; the parent only checks that
// the child passed (its subtests skip as forEachHelper says: a helper not built).
func underENOSYS(t *testing.T, nr uintptr) bool {
	t.Helper()
	if os.Getenv(enosysEnv) == "" {
		if os.Geteuid() != 0 {
			t.Skip("needs root: strict isolation; CI runs as root")
		}
		self, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(self, "-test.run=^"+t.Name()+"$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), enosysEnv+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: "+t.Name()+" ") {
			t.Fatalf("under a filter refusing system call %d: %v\n%s", nr, err, out)
		}
		return false
	}
	denyENOSYS(t, nr)
	if _, _, errno := unix.Syscall(nr, 0, 0, 0); errno != unix.ENOSYS {
		t.Fatalf("system call %d under the filter: %v, want ENOSYS", nr, errno)
	}
	return true
}

// Under a filter that answers clone3 with ENOSYS, as systemd (251 and later) installs for
// a unit with RestrictNamespaces= (the shipped one), every way a command starts still
// works: a launcher made ahead, one forked for a command that found none, a plain start;
// each command in its own child cgroup, at the root of its cgroup namespace. On cgroup
// v1, where nothing clones into a cgroup, it shows the filter changes nothing; the VM's
// v2 variants run it where it matters.
func TestStartsWithoutClone3(t *testing.T) {
	if !underENOSYS(t, unix.SYS_CLONE3) {
		return
	}
	forEachHelper(t, func(t *testing.T, s *Sandbox) {
		l := newTestLease(t, s, nil)
		for i, how := range []string{"first", "back to back", "after quiet"} {
			if how == "after quiet" && !cold(t) {
				readyLauncher(t, s, l.ID)
			}
			r := run(t, s, l.ID, sh(`sleep 100 >/dev/null 2>&1 & echo $!; cat /proc/self/cgroup`))
			got := lines(r.stdout)
			if r.exitCode != 0 || len(got) < 2 {
				t.Fatalf("command %d (%s): %+v", i, how, r)
			}
			pid, _ := strconv.Atoi(got[0])
			pids, err := s.cg.ChildPids(l.ID, r.cgroup)
			syscall.Kill(pid, syscall.SIGKILL)
			if err != nil || !slices.Contains(pids, pid) {
				t.Errorf("command %d (%s): its process %d not in its child cgroup %s (%v, %v)", i, how, pid, r.cgroup, pids, err)
			}
			for _, line := range got[1:] {
				if !strings.HasSuffix(line, ":/") {
					t.Errorf("command %d (%s): /proc/self/cgroup line %q, want the root of its cgroup namespace", i, how, line)
				}
			}
		}
	})
}

// denyENOSYS makes the system call nr fail with ENOSYS in every thread of this process
// from now on.
func denyENOSYS(t *testing.T, nr uintptr) {
	t.Helper()
	prog := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 0}, // the system call number
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 1, K: uint32(nr)},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW},
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if _, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog))); errno != 0 {
		t.Fatalf("seccomp: %v", errno)
	}
}

// Under a filter that answers openat2 with ENOSYS, as systemd's does for a unit with
// RestrictSUIDSGID=yes, a lease in an image is refused at provision, naming the setting,
// with nothing made for it: the daemon and the helper resolve its paths with openat2.
// Leases on the host's root are not concerned.
func TestImageLeasesWithoutOpenat2(t *testing.T) {
	if !underENOSYS(t, unix.SYS_OPENAT2) {
		return
	}
	forEachHelper(t, func(t *testing.T, s *Sandbox) {
		newTestLease(t, s, nil) // a lease on the host's root: provisioned
		// Not under /tmp, which the lease's own /tmp hides.
		work, err := os.MkdirTemp("/var/tmp", "sidecar-sandbox-")
		if err != nil {
			t.Fatal(err)
		}
		l := LeaseSpec{ID: "image-no-openat2", UID: 300001, GID: 300001, Workdir: filepath.Join(work, "work"),
			TmpDir: filepath.Join(work, "tmp"), Root: &LeaseRoot{Layers: []string{t.TempDir()}}}
		for _, d := range []string{l.Workdir, l.TmpDir} {
			if err := os.MkdirAll(d, 0o700); err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(func() {
			if err := s.Teardown(context.Background(), l.ID); err != nil {
				t.Errorf("Teardown: %v", err)
			}
			if err := s.Retire(context.Background(), l.ID); err != nil {
				t.Errorf("Retire: %v", err)
			}
			os.RemoveAll(work)
		})
		err = s.Provision(context.Background(), l)
		if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "RestrictSUIDSGID=") {
			t.Errorf("Provision of a lease in an image: %v; want ErrUnsupported naming RestrictSUIDSGID=", err)
		}
		if _, err := os.Stat(filepath.Join(work, "root")); !os.IsNotExist(err) {
			t.Errorf("made for the refused lease: %v", err)
		}
	})
}
