package sandbox

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sidecar-sandbox/sidecar/internal/kernel/landlock"
)

// landlockCaps are the Landlock ABIs the helpers branch on (none, 1 without refer, 2
// without truncate, 3 and 4 without device ioctls, 5 without scoping, 6 and above), each
// below this kernel's, then the kernel's own (0: no cap).
func landlockCaps() []int {
	kernel := landlock.ABI()
	if kernel == 0 {
		return []int{0}
	}
	caps := []int{NoLandlock}
	for _, abi := range []int{1, 2, 3, 5, 6} {
		if abi < kernel {
			caps = append(caps, abi)
		}
	}
	return append(caps, 0)
}

// The isolation checks at every Landlock ABI the helpers branch on, with both helpers, on
// this one kernel: a regression at a lower ABI (Debian 12 has 2, Ubuntu 22.04 has 1) shows
// here without a VM. The layers each ABI adds must hold, the ones it lacks must really be
// absent (so the cap is real), and what covers the gap must hold at every ABI.
func TestIsolationAtEachLandlockABI(t *testing.T) {
	for _, cap := range landlockCaps() {
		for _, h := range testHelpers {
			t.Run(fmt.Sprintf("cap%d/%s", cap, h.name), func(t *testing.T) {
				s := newTestSandboxConfig(t, Config{HelperPath: h.usable(t), LandlockMaxABI: cap})
				abi := s.Caps().LandlockABI
				if want := appliedLandlockABI(landlock.ABI(), cap); abi != want {
					t.Fatalf("Caps().LandlockABI = %d, want %d", abi, want)
				}
				t.Run("isolated", func(t *testing.T) { testLeasesAreIsolated(t, s) })
				t.Run("view", func(t *testing.T) { testLeaseProcessView(t, s) })
				t.Run("workspace", func(t *testing.T) { testWorkspaceAndUser(t, s) })
				t.Run("layers", func(t *testing.T) { testLandlockLayersHold(t, s, abi) })
				if abi >= 1 {
					t.Run("confines", func(t *testing.T) { testLandlockConfines(t, s) })
				}
			})
		}
	}
}

// testLandlockLayersHold checks each Landlock layer by what only it stops, so it holds
// exactly from its ABI on, and checks what covers the gap below ABI 6.
func testLandlockLayersHold(t *testing.T, s *Sandbox, abi int) {
	l := newTestLease(t, s, nil)
	n := newTestLease(t, s, func(l *LeaseSpec) { l.Network = &LeaseNetwork{} })
	probeL, probeN := installProbe(t, l), installProbe(t, n)
	base := filepath.Dir(l.Workdir)

	expect := func(what string, r result, allowed bool) {
		t.Helper()
		if (r.exitCode == 0) != allowed {
			t.Errorf("ABI %d: %s: exit %d (%s%s), want allowed=%v", abi, what, r.exitCode, r.stdout, r.stderr, allowed)
		}
	}
	// Refer (ABI 2): ABI 1 refuses every link or rename across directories, even inside
	// the lease's own workdir; no Landlock and ABI 2 allow it there.
	expect("link across directories in the workdir",
		run(t, s, l.ID, sh(`mkdir a b && echo x > a/f && ln a/f b/g`)), abi == 0 || abi >= 2)

	// Truncate (ABI 3): truncate(2) of a world-writable file outside the lease. Below ABI
	// 3 Landlock does not handle it, and the file's mode allows it.
	victim := filepath.Join(base, "victim")
	if err := os.WriteFile(victim, []byte("x"), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(victim, 0o666); err != nil { // past the umask
		t.Fatal(err)
	}
	expect("truncate(2) a world-writable file outside the lease",
		run(t, s, l.ID, probeSpec(probeL, "truncate", victim)), abi < 3)

	// Scoping (ABI 6) stops a signal to a process of the lease's own uid outside its
	// Landlock domain; below it the uid is what stops signals to anyone else.
	outside := exec.Command("sleep", "100")
	outside.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(l.UID), Gid: uint32(l.GID)}}
	if err := outside.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { outside.Process.Kill(); outside.Wait() }()
	expect("signal a process of its own uid outside the sandbox",
		run(t, s, l.ID, sh(fmt.Sprintf("kill -0 %d", outside.Process.Pid))), abi < 6)
	expect("signal a process of another uid", run(t, s, l.ID, sh(fmt.Sprintf("kill -0 %d", os.Getpid()))), false)

	// Abstract unix sockets: scoped from ABI 6; below it a lease with network "none" still
	// cannot reach the host's (they are per network namespace), one with "host" can.
	name := fmt.Sprintf("@sidecar-test-%d", rand.Int64())
	ln, err := net.Listen("unix", name)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	expect("connect to a host abstract socket, network host", run(t, s, l.ID, probeSpec(probeL, "connect", name)), abi < 6)
	expect("connect to a host abstract socket, network none", run(t, s, n.ID, probeSpec(probeN, "connect", name)), false)
}

// probeArg runs the test binary as a probe inside a lease: one system call that no shell
// tool makes on its own (see probeMain).
const probeArg = "__sandbox-probe"

// installProbe copies the test binary into the lease's workdir (the only place a lease
// may execute that is not a system directory) and returns its path in the lease.
func installProbe(t *testing.T, l LeaseSpec) string {
	t.Helper()
	self := mustExecutable(t)
	src, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst := filepath.Join(l.Workdir, "probe")
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, src); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dst, l.UID, l.GID); err != nil {
		t.Fatal(err)
	}
	return Workspace + "/probe" // as the lease names it
}

func probeSpec(probe string, args ...string) Spec {
	return Spec{Argv: append([]string{probe, probeArg}, args...)}
}

// probeMain is the probe: exit 0 when the call succeeds, 1 with the error when refused.
func probeMain(args []string) int {
	if len(args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: probe truncate|connect ARG")
		return 2
	}
	var err error
	switch args[0] {
	case "truncate":
		err = unix.Truncate(args[1], 0)
	case "connect":
		var c net.Conn
		if c, err = net.Dial("unix", args[1]); err == nil {
			c.Close()
		}
	default:
		err = fmt.Errorf("unknown probe %q", args[0])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("allowed: " + args[0] + " " + strconv.Quote(args[1]))
	return 0
}
