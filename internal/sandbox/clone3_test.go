package sandbox

import (
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// noClone3Env marks the child process TestStartsWithoutClone3 runs itself in.
const noClone3Env = "SIDECAR_TEST_NO_CLONE3"

// Under a seccomp filter that answers clone3 with ENOSYS, as systemd (251 and later)
// installs for a unit with RestrictNamespaces= (the shipped one), every way a command
// starts still works: a launcher made ahead, one forked for a command that found none, a
// plain start; each command in its own child cgroup, at the root of its cgroup namespace.
// A filter binds the process for good, so the test runs in a child process of its own.
// On cgroup v1, where nothing clones into a cgroup, it shows the filter changes nothing;
// the VM's v2 variants run it where it matters.
func TestStartsWithoutClone3(t *testing.T) {
	if os.Getenv(noClone3Env) == "" {
		if os.Geteuid() != 0 {
			t.Skip("needs root: strict isolation; CI runs as root")
		}
		self, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(self, "-test.run=^TestStartsWithoutClone3$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), noClone3Env+"=1")
		out, err := cmd.CombinedOutput()
		// Its subtests skip as forEachHelper says (a helper not built), never the test.
		if err != nil || !strings.Contains(string(out), "--- PASS: TestStartsWithoutClone3 ") {
			t.Fatalf("under the clone3 filter: %v\n%s", err, out)
		}
		return
	}
	denyClone3(t)
	if _, _, errno := unix.Syscall(unix.SYS_CLONE3, 0, 0, 0); errno != unix.ENOSYS {
		t.Fatalf("clone3 under the filter: %v, want ENOSYS", errno)
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

// denyClone3 makes clone3 fail with ENOSYS in every thread of this process from now on,
// as systemd's filter for RestrictNamespaces= does, with no_new_privs as the unit sets it.
func denyClone3(t *testing.T) {
	t.Helper()
	prog := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 0}, // the system call number
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 1, K: unix.SYS_CLONE3},
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
