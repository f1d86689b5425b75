package confine

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestV2Paths(t *testing.T) {
	yes := func(string) bool { return true }
	no := func(string) bool { return false }
	for _, tc := range []struct {
		self       string
		delegated  func(string) bool
		leaf, base string
	}{
		{"0::/system.slice/sidecar.service\n", yes, "/sys/fs/cgroup/system.slice/sidecar.service/daemon", "/sys/fs/cgroup/system.slice/sidecar.service/sidecar"},
		{"0::/system.slice/sidecar.service/daemon\n", no, "/sys/fs/cgroup/system.slice/sidecar.service/daemon", "/sys/fs/cgroup/system.slice/sidecar.service/sidecar"},
		{"0::/\n", yes, "", "/sys/fs/cgroup/sidecar"},
		{"0::/\n", no, "", "/sys/fs/cgroup/sidecar"},
		{"1:name=systemd:/x\n0::/a/b\n", yes, "/sys/fs/cgroup/a/b/daemon", "/sys/fs/cgroup/a/b/sidecar"},
		// Started by hand from a login session: the daemon stays in its scope, leases go
		// to a subtree of their own at the top.
		{"0::/user.slice/user-0.slice/session-3.scope\n", no, "", "/sys/fs/cgroup/sidecar"},
	} {
		leaf, base, err := v2Paths(tc.self, "/sys/fs/cgroup", "sidecar", tc.delegated)
		if err != nil || leaf != tc.leaf || base != tc.base {
			t.Errorf("v2Paths(%q) = %q, %q, %v; want %q, %q", tc.self, leaf, base, err, tc.leaf, tc.base)
		}
	}
	if _, _, err := v2Paths("4:memory:/x\n", "/sys/fs/cgroup", "sidecar", yes); err == nil {
		t.Error("v2Paths without a 0:: line: want an error")
	}
}

// v2Delegated on a fake cgroup directory: systemd's mark, a systemd service, or alone
// in a cgroup on a host without systemd.
func TestV2Delegated(t *testing.T) {
	env := func(vars map[string]string) func(string) string { return func(k string) string { return vars[k] } }
	none := env(nil)
	svc := env(map[string]string{"INVOCATION_ID": "0123"})
	dir := filepath.Join(t.TempDir(), "sidecar.service")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	procs := func(s string) {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	procs("42\n")
	for _, tc := range []struct {
		name    string
		getenv  func(string) string
		systemd bool
		want    bool
	}{
		{"alone, no systemd", none, false, true},
		{"alone under systemd, not delegated", none, true, false},
		{"a systemd service", svc, true, true},
	} {
		if got := v2Delegated(dir, tc.getenv, 42, tc.systemd); got != tc.want {
			t.Errorf("%s: v2Delegated = %v, want %v", tc.name, got, tc.want)
		}
	}
	procs("42\n77\n")
	if v2Delegated(dir, none, 42, false) {
		t.Error("sharing its cgroup (a login shell beside it): want not delegated")
	}
	if v2Delegated(filepath.Join(t.TempDir(), "session-3.scope"), svc, 42, true) {
		t.Error("INVOCATION_ID in a scope: want not delegated")
	}
	if os.Geteuid() == 0 {
		// trusted.* xattrs need root; systemd sets trusted.delegate on Delegate=yes cgroups.
		if err := unix.Setxattr(dir, "trusted.delegate", []byte("1"), 0); err != nil {
			t.Fatalf("set trusted.delegate on %s: %v", dir, err)
		}
		if !v2Delegated(dir, none, 42, true) {
			t.Error("marked trusted.delegate=1: want delegated")
		}
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

// BenchmarkChildCgroup is what each command's own cgroup costs: made in every hierarchy
// (on v1, each controller's), asked for its processes when the command ends (its
// leftovers), removed after.
func BenchmarkChildCgroup(b *testing.B) {
	e := newTestEngine(b, "bench-child")
	for b.Loop() {
		if err := e.cg.NewChild("bench-child", "c"); err != nil {
			b.Fatal(err)
		}
		if pids, err := e.cg.ChildPids("bench-child", "c"); err != nil || len(pids) != 0 {
			b.Fatal(pids, err)
		}
		if err := e.cg.RemoveChild("bench-child", "c"); err != nil {
			b.Fatal(err)
		}
	}
}
