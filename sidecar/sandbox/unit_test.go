package sandbox

import (
	"errors"
	"strings"
	"testing"

	"github.com/sidecar-sandbox/sidecar/sidecar/process"
)

func TestV2Paths(t *testing.T) {
	for _, tc := range []struct{ self, leaf, base string }{
		{"0::/system.slice/sidecar.service\n", "/sys/fs/cgroup/system.slice/sidecar.service/daemon", "/sys/fs/cgroup/system.slice/sidecar.service/sidecar"},
		{"0::/system.slice/sidecar.service/daemon\n", "/sys/fs/cgroup/system.slice/sidecar.service/daemon", "/sys/fs/cgroup/system.slice/sidecar.service/sidecar"},
		{"0::/\n", "", "/sys/fs/cgroup/sidecar"},
		{"1:name=systemd:/x\n0::/a/b\n", "/sys/fs/cgroup/a/b/daemon", "/sys/fs/cgroup/a/b/sidecar"},
	} {
		leaf, base, err := v2Paths(tc.self, "/sys/fs/cgroup", "sidecar")
		if err != nil || leaf != tc.leaf || base != tc.base {
			t.Errorf("v2Paths(%q) = %q, %q, %v; want %q, %q", tc.self, leaf, base, err, tc.leaf, tc.base)
		}
	}
	if _, _, err := v2Paths("4:memory:/x\n", "/sys/fs/cgroup", "sidecar"); err == nil {
		t.Error("v2Paths without a 0:: line: want an error")
	}
}

func TestParseV1Mounts(t *testing.T) {
	info := `32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw`
	got := parseV1Mounts(info)
	want := map[string]string{"cpu": "/sys/fs/cgroup/cpu,cpuacct", "cpuacct": "/sys/fs/cgroup/cpu,cpuacct",
		"memory": "/sys/fs/cgroup/memory", "freezer": "/sys/fs/cgroup/freezer", "pids": "/sys/fs/cgroup/pids"}
	if len(got) != len(want) {
		t.Fatalf("got %v", got)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: got %q, want %q", k, got[k], v)
		}
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	for _, cfg := range []Config{
		{Isolation: "some"},
		{CgroupParent: "../escape"},
		{CgroupParent: "/abs"},
		{HelperPath: "relative"},
	} {
		if _, err := New(cfg); !errors.Is(err, ErrInvalid) {
			t.Errorf("New(%+v) = %v, want ErrInvalid", cfg, err)
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
	r := run(t, s, l.ID, sh(`echo $TMPDIR; pwd`))
	if out := lines(r.stdout); len(out) != 2 || out[0] != l.TmpDir || out[1] != l.Workdir {
		t.Errorf("got %q %s", out, r.stderr)
	}
}

// A PTY from OpenPTY, started the way package process does (Setctty added to the
// SysProcAttr Command set): the target gets the terminal, of the lease's own devpts
// instance, as its controlling tty.
func TestTTY(t *testing.T) { forEachHelper(t, testTTY) }

func testTTY(t *testing.T, s *Sandbox) {
	l := newTestLease(t, s, nil)
	cmd, tr, err := s.Command(l.ID, process.Spec{Argv: []string{"/bin/sh", "-c", `tty; test -t 0 && echo isatty; echo TERM=$TERM; ps -o tty= -p $$`}, TTY: true})
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
