package sandbox

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sidecar-sandbox/sidecar/internal/testtool"
)

// surfaceProbe makes each system call in a child of its own (so that a user namespace one
// call got does not change the next) and prints name=ok or name=<errno>. Arguments are
// passed as 64-bit values: "_high" cases set bit 32, which the kernel ignores for int
// arguments and a filter comparing 64 bits would miss.
var surfaceProbe = fmt.Sprintf(`
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def probe(name, nr, *args):
    pid = os.fork()
    if pid == 0:
        r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
        os._exit(ctypes.get_errno() if r < 0 else 0)
    e = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    print("%%s=%%s" %% (name, errno.errorcode.get(e, e) if e else "ok"))
probe("unshare_user", %[1]d, 0x10000000)
probe("unshare_user_high", %[1]d, 0x10000000 | 1 << 32)
probe("unshare_user_net", %[1]d, 0x50000000)
probe("unshare_files", %[1]d, 0x400)
probe("clone3", %[2]d, 0, 0)
probe("keyctl", %[3]d, 0, -3, 0)
probe("userfaultfd", %[4]d, 1)
probe("socket_netfilter", %[5]d, 16, 3, 12)
probe("socket_netfilter_high", %[5]d, 16 | 1 << 32, 3, 12)
probe("socket_raw", %[5]d, 2, 3, 1)
probe("socket_raw6_cloexec", %[5]d, 10, 3 | 0x80000, 58)
probe("socket_packet", %[5]d, 17, 3, 0)
probe("socket_tcp", %[5]d, 2, 1, 0)
probe("socket_udp6", %[5]d, 10, 2, 0)
probe("socket_netlink_route", %[5]d, 16, 3, 0)
probe("socket_unix", %[5]d, 1, 1, 0)
probe("socket_vsock", %[5]d, 40, 1, 0)
probe("socket_vsock_high", %[5]d, 40 | 1 << 32, 1, 0)
probe("socket_bluetooth", %[5]d, 31, 3, 0)
probe("socket_alg", %[5]d, 38, 5, 0)
probe("socket_zero", %[5]d, 0, 1, 0)
probe("personality_query", %[6]d, 0xffffffff)
probe("personality_linux32", %[6]d, 8)
probe("personality_norandom", %[6]d, 0x40000)
probe("personality_high_query", %[6]d, 0xffffffff | 1 << 32)
probe("io_uring_setup", %[7]d, 1, 0)
probe("mount", %[8]d, 0, 0, 0, 0, 0)
probe("ptrace_attach_nopid", %[9]d, 16, 0, 0, 0)
probe("mincore", %[10]d, 0, 0, 0)
probe("pkey_alloc", %[11]d, 0, 0)
`, unix.SYS_UNSHARE, unix.SYS_CLONE3, unix.SYS_KEYCTL, unix.SYS_USERFAULTFD, unix.SYS_SOCKET,
	unix.SYS_PERSONALITY, unix.SYS_IO_URING_SETUP, unix.SYS_MOUNT, unix.SYS_PTRACE,
	unix.SYS_MINCORE, unix.SYS_PKEY_ALLOC)

// What the probe must find in a lease under the filter. Only ENOSYS (clone3) and EPERM are
// the filter's; "ok" calls are ones a lease needs.
var filtered = map[string]string{
	"unshare_user": "EPERM", "unshare_user_high": "EPERM", "unshare_user_net": "EPERM",
	"unshare_files": "ok", "clone3": "ENOSYS", "keyctl": "EPERM", "userfaultfd": "EPERM",
	"socket_netfilter": "EPERM", "socket_netfilter_high": "EPERM", "socket_raw": "EPERM",
	"socket_raw6_cloexec": "EPERM", "socket_packet": "EPERM", "socket_tcp": "ok", "socket_udp6": "ok",
	"socket_netlink_route": "ok", "socket_unix": "ok", "socket_vsock": "EPERM", "socket_vsock_high": "EPERM",
	"socket_bluetooth": "EPERM", "socket_alg": "EPERM", "socket_zero": "EPERM", "personality_query": "ok", "personality_linux32": "ok",
	"personality_norandom": "EPERM", "io_uring_setup": "EPERM", "mount": "EPERM",
	"ptrace_attach_nopid": "ESRCH", // reached the kernel: debuggers work (no pid 0 to attach to)
	"mincore":             "ok",
}

// unfiltered is what the same probe finds with SIDECAR_SECCOMP=off, for the calls that
// show the filter (not the lease's uid) is what refuses them above.
var unfiltered = map[string]string{
	"unshare_user": "ok", "unshare_user_net": "ok", "clone3": "EINVAL", "keyctl": "ok",
	"userfaultfd": "ok", "socket_netfilter": "ok", "personality_norandom": "ok", "io_uring_setup": "EFAULT", // EFAULT: it reached the kernel
}

func probeSurface(t *testing.T, s *Sandbox, leaseID string) map[string]string {
	t.Helper()
	needPython(t)
	r := run(t, s, leaseID, Spec{Argv: []string{"/usr/bin/python3", "-c", surfaceProbe}})
	if r.exitCode != 0 {
		t.Fatalf("probe: exit %d: %s", r.exitCode, r.stderr)
	}
	got := map[string]string{}
	for _, l := range lines(r.stdout) {
		k, v, _ := strings.Cut(l, "=")
		got[k] = v
	}
	return got
}

// A lease cannot reach the kernel's namespace, keyring, raw-socket... surface; what it
// needs still works.
func TestKernelSurfaceDenied(t *testing.T) { forEachHelper(t, testKernelSurfaceDenied) }

func testKernelSurfaceDenied(t *testing.T, s *Sandbox) {
	if !s.Caps().Seccomp {
		t.Fatal("Caps().Seccomp = false by default")
	}
	l := newTestLease(t, s, nil)
	got := probeSurface(t, s, l.ID)
	for k, want := range filtered {
		if got[k] != want {
			t.Errorf("%s = %q, want %q", k, got[k], want)
		}
	}
	// personality's query with bit 32 set is the query to the kernel (an unsigned int).
	if got["personality_high_query"] != "ok" {
		t.Errorf("personality_high_query = %q", got["personality_high_query"])
	}
	// Memory protection keys (V8's JIT takes one where the CPU has them): whatever the CPU
	// says, not the filter's EPERM.
	if got["pkey_alloc"] == "EPERM" || got["pkey_alloc"] == "" {
		t.Errorf("pkey_alloc = %q, want the kernel's answer", got["pkey_alloc"])
	}
	// The tools people reach for, which must fail.
	for _, cmd := range []string{"unshare -U true", "unshare -r true", "unshare -rn true", "unshare -n true", "unshare -m true"} {
		if r := run(t, s, l.ID, sh(cmd)); r.exitCode == 0 {
			t.Errorf("%s in a lease: exit 0", cmd)
		}
	}
}

// With SIDECAR_SECCOMP=off the same calls succeed: the filter is what refuses them.
func TestSeccompOff(t *testing.T) {
	for _, h := range testHelpers {
		t.Run(h.name, func(t *testing.T) {
			s := newTestSandboxConfig(t, Config{HelperPath: h.usable(t), Seccomp: SeccompOff})
			if s.Caps().Seccomp {
				t.Fatal("Caps().Seccomp = true with seccomp off")
			}
			l := newTestLease(t, s, nil)
			got := probeSurface(t, s, l.ID)
			for k, want := range unfiltered {
				if got[k] != want {
					t.Errorf("%s = %q, want %q (without the filter)", k, got[k], want)
				}
			}
		})
	}
}

// A system call through another architecture's entry (int 0x80 on x86_64) or the x32 ABI
// would bypass a filter keyed on x86_64 numbers: the process is killed instead. The probe
// is compiled in the lease, which also shows a C compiler works there.
func TestForeignArchitectureKilled(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the probe is x86_64 assembly")
	}
	testtool.Need(t, "cc", "gcc", "it compiles the probe")
	// Whether this kernel runs i386 system calls at all (ia32_emulation): if not, int 0x80
	// never reaches the filter and only x32 is checked.
	dir := t.TempDir()
	if err := os.WriteFile(dir+"/arch.c", []byte(archProbe), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("cc", "-o", dir+"/arch", dir+"/arch.c").CombinedOutput()
	if err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	i386 := exec.Command(dir+"/arch", "i").Run() == nil
	forEachHelper(t, func(t *testing.T, s *Sandbox) {
		l := newTestLease(t, s, nil)
		script := "cat > arch.c <<'EOF'\n" + archProbe + "EOF\ncc -o arch arch.c || exit 100\n" +
			"./arch x; echo x32=$?; ./arch i; echo i386=$?\n"
		r := run(t, s, l.ID, sh(script))
		if r.exitCode != 0 {
			t.Fatalf("probe: exit %d: %s", r.exitCode, r.stderr)
		}
		want := "x32=159" // 128 + SIGSYS
		if !strings.Contains(r.stdout, want) {
			t.Errorf("x32 system call in a lease: %q, want %s", r.stdout, want)
		}
		if !i386 {
			t.Logf("this kernel runs no i386 system calls: int 0x80 not checked")
		} else if !strings.Contains(r.stdout, "i386=159") {
			t.Errorf("i386 system call in a lease: %q, want i386=159", r.stdout)
		}
	})
}

const archProbe = `#include <stdio.h>
#include <unistd.h>
#include <sys/syscall.h>
int main(int argc, char **argv) {
	long r;
	if (argc > 1 && argv[1][0] == 'x')
		r = syscall(0x40000000 | SYS_getpid);
	else
		__asm__ volatile("int $0x80" : "=a"(r) : "a"(20L) : "memory");
	printf("%ld\n", r);
	return 0;
}
`

// Every lease process gets LeaseRlimits, soft and hard.
func TestLeaseRlimits(t *testing.T) { forEachHelper(t, testLeaseRlimits) }

func testLeaseRlimits(t *testing.T, s *Sandbox) {
	needPython(t)
	l := newTestLease(t, s, nil)
	r := run(t, s, l.ID, Spec{Argv: []string{"/usr/bin/python3", "-c", `
import resource as r
for n in ("NOFILE", "CORE", "MEMLOCK", "MSGQUEUE", "SIGPENDING", "FSIZE"):
    print(n, *r.getrlimit(getattr(r, "RLIMIT_" + n)))`}})
	if r.exitCode != 0 {
		t.Fatalf("exit %d: %s", r.exitCode, r.stderr)
	}
	// RLIMIT_FSIZE stays unlimited (python's -1): the disk quota bounds writes.
	want := "NOFILE 4096 4096\nCORE 0 0\nMEMLOCK 65536 65536\nMSGQUEUE 819200 819200\nSIGPENDING 4096 4096\nFSIZE -1 -1"
	if got := strings.TrimSpace(r.stdout); got != want {
		t.Errorf("limits in a lease:\n%s\nwant\n%s", got, want)
	}
}
