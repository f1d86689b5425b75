package sandbox

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/user"
	"slices"
	"strings"
	"testing"

	"github.com/sidecar-sandbox/sidecar/internal/kernel/landlock"
)

// The settings' rules are the daemon's (Config.Check); New trusts them, but for the helper
// it is handed, which it runs.
func TestNewRejectsARelativeHelper(t *testing.T) {
	if _, err := New(Config{HelperPath: "relative"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("New with a relative helper path = %v, want ErrInvalid", err)
	}
}

// An operator's floor above what the host gives refuses to start, naming the kernel
// that has it; the floor is checked against the ABI lease processes would really get.
func TestNewRefusesBelowFloor(t *testing.T) {
	kernel := landlock.ABI()
	if kernel < 2 {
		t.Skipf("needs Landlock ABI >= 2 to cap below it; this kernel has %d", kernel)
	}
	for _, iso := range []string{IsolationNone, IsolationStrict} {
		_, err := New(Config{Isolation: iso, MinLandlockABI: 2, LandlockMaxABI: 1, CgroupParent: testCgroupParent})
		if err == nil || !strings.Contains(err.Error(), "Landlock ABI >= 2 as required (Linux 5.19 or later") || !strings.Contains(err.Error(), "capped at 1") {
			t.Errorf("%s: New below the floor = %v", iso, err)
		}
	}
	if _, err := New(Config{Isolation: IsolationNone, MinLandlockABI: kernel}); err != nil {
		t.Errorf("New at the floor: %v", err)
	}
}

// A required cgroup mode other than the host's refuses to start, naming both.
func TestNewRefusesOtherCgroupMode(t *testing.T) {
	have := newTestSandbox(t).Caps().Cgroups
	other := map[string]string{"v1": "v2", "v2": "v1"}[have]
	_, err := New(Config{CgroupParent: testCgroupParent, RequireCgroup: other})
	if want := fmt.Sprintf("cgroup %s as required (this host's controllers are on cgroup %s)", other, have); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("New requiring cgroup %s on a %s host = %v, want %q", other, have, err, want)
	}
	s, err := New(Config{CgroupParent: testCgroupParent, RequireCgroup: have})
	if err != nil {
		t.Fatalf("New requiring this host's mode: %v", err)
	}
	s.Close()
}

func TestLayers(t *testing.T) {
	for _, tc := range []struct {
		caps Caps
		want string
	}{
		{Caps{}, ""},
		{Caps{Cgroups: "v2", UIDIsolation: true, PrivateTmp: true, NetworkIsolation: true}, "cgroup-v2 uid mount-ns net-ns"},
		{Caps{Cgroups: "v1", LandlockABI: 1}, "cgroup-v1 landlock-fs"},
		{Caps{LandlockABI: 2}, "landlock-fs landlock-fs-refer"},
		{Caps{LandlockABI: 4}, "landlock-fs landlock-fs-refer landlock-fs-truncate"},
		{Caps{LandlockABI: 5}, "landlock-fs landlock-fs-refer landlock-fs-truncate landlock-fs-ioctl-dev"},
		{Caps{LandlockABI: 7}, "landlock-fs landlock-fs-refer landlock-fs-truncate landlock-fs-ioctl-dev landlock-scope"},
	} {
		if got := strings.Join(tc.caps.layers(), " "); got != tc.want {
			t.Errorf("layers(%+v) = %q, want %q", tc.caps, got, tc.want)
		}
	}
	for abi, kernel := range map[int]string{0: "", 1: "5.13", 2: "5.19", 3: "6.2", 4: "6.7", 5: "6.10", 6: "6.12", 7: "6.15", 8: ""} {
		if got := LandlockLinux(abi); got != kernel {
			t.Errorf("LandlockLinux(%d) = %q, want %q", abi, got, kernel)
		}
	}
	for _, tc := range []struct{ kernel, max, want int }{{7, 0, 7}, {7, 3, 3}, {2, 6, 2}, {7, NoLandlock, 0}, {0, 3, 0}} {
		if got := appliedLandlockABI(tc.kernel, tc.max); got != tc.want {
			t.Errorf("appliedLandlockABI(%d, %d) = %d, want %d", tc.kernel, tc.max, got, tc.want)
		}
	}
}

// Isolation "none" works for any user: no cgroup, no uid switch, process-group kill.
func TestIsolationNone(t *testing.T) {
	for _, h := range testHelpers {
		t.Run(h.name, func(t *testing.T) { testIsolationNone(t, h.usable(t)) })
	}
}

func testIsolationNone(t *testing.T, helper string) {
	s, err := New(Config{Isolation: IsolationNone, HelperPath: helper})
	if err != nil {
		t.Fatal(err)
	}
	if c := s.Caps(); c.Isolation != IsolationNone || c.Cgroups != "none" || c.UIDIsolation {
		t.Errorf("Caps = %+v", c)
	}
	l := newTestLeaseAs(t, s, func(l *LeaseSpec) { l.UID, l.GID = 0, 0 })
	// No mount namespace: the host paths are what the process sees, and it is the
	// daemon's user; /workspace still names the workdir as a cwd.
	r := run(t, s, l.ID, Spec{Argv: []string{"/bin/sh", "-c", `echo $TMPDIR; pwd; echo $HOME; echo $USER; id -un`}, Dir: "/workspace"})
	self, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{l.TmpDir, l.Workdir, l.Workdir, self.Username, self.Username}
	if out := lines(r.stdout); !slices.Equal(out, want) {
		t.Errorf("got %q, want %q %s", out, want, r.stderr)
	}
}

// A PTY from OpenPTY, started the way package process does (Setctty added to the
// SysProcAttr Command set): the target gets the terminal, of the lease's own devpts
// instance, as its controlling tty.
func TestTTY(t *testing.T) { forEachHelper(t, testTTY) }

func testTTY(t *testing.T, s *Sandbox) {
	l := newTestLease(t, s, nil)
	cmd, tr, err := s.Command(l.ID, Spec{Argv: []string{"/bin/sh", "-c", `tty; test -t 0 && echo isatty; echo TERM=$TERM; ps -o tty= -p $$`}, TTY: true})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	got := runTTY(t, s, l.ID, cmd, tr)
	for _, want := range []string{"/dev/pts/", "isatty", "TERM=xterm-256color", "pts/"} {
		if !strings.Contains(got, want) {
			t.Errorf("output %q lacks %q", got, want)
		}
	}
	if strings.Contains(got, "?") {
		t.Errorf("no controlling terminal: %q", got)
	}
}

// A cgroup parent is claimed by one daemon at a time; the refusal names the holder, and
// the claim goes with the holder (here: its lock file closed), and so does the file.
func TestClaimParent(t *testing.T) {
	dir := t.TempDir()
	log := slog.New(slog.DiscardHandler)
	first, err := claimParent(dir, "v1:sidecar", "/srv/first", log)
	if err != nil {
		t.Fatal(err)
	}
	_, err = claimParent(dir, "v1:sidecar", "/srv/second", log)
	if !errors.Is(err, ErrParentOwned) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d with state dir /srv/first", os.Getpid())) {
		t.Fatalf("second claim = %v, want ErrParentOwned naming the first", err)
	}
	other, err := claimParent(dir, "v1:sidecar-dev", "/srv/second", log)
	if err != nil {
		t.Fatalf("a claim on another parent: %v", err)
	}
	other.Close(false)
	first.Close(true) // leaves leases: the record stays for the next holder to read
	second, err := claimParent(dir, "v1:sidecar", "/srv/second", log)
	if err != nil {
		t.Fatalf("claim after the holder went: %v", err)
	}
	// A daemon that opened the lock file just before its holder left (and unlinked it)
	// must not count the lock it then gets on the unlinked file as a claim.
	late, err := os.Open(second.path)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	if err := second.Close(false); err != nil {
		t.Fatal(err)
	}
	if samePath(late, second.path) {
		t.Error("a file unlinked by its holder still counts as the lock file")
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("lock files left after every holder closed without leases: %v", left)
	}
}

// The namespace probe leaves every thread of the daemon in the daemon's mount namespace
// and working directory: a thread left in a namespace of its own (the main thread cannot
// die) would make /proc/self name the wrong namespace, and one with a working directory
// of its own would resolve relative paths elsewhere.
func TestProbeNamespacesLeavesNoThreadBehind(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to make namespaces")
	}
	host, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	cwd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	helper := goHelperPath(t)
	for range 20 {
		if missing := probeNamespaces(helper); len(missing) > 0 {
			t.Fatalf("probe: %v", missing)
		}
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		ns, err := os.Readlink("/proc/self/task/" + task.Name() + "/ns/mnt")
		if err != nil {
			continue // the thread exited meanwhile
		}
		if ns != host {
			t.Errorf("thread %s is in mount namespace %s, the daemon in %s", task.Name(), ns, host)
		}
		if dir, err := os.Readlink("/proc/self/task/" + task.Name() + "/cwd"); err == nil && dir != cwd {
			t.Errorf("thread %s works in %s, the daemon in %s", task.Name(), dir, cwd)
		}
	}
}
