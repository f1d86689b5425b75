package sidecar_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// A helper that cannot join its command's cgroup (the spare child cgroup the next exec
// takes is removed under the daemon) fails the exec with sandbox_setup_failed naming the
// step, not with exit 125. On v1 the helper reports it; on v2 the daemon cannot clone
// into it. Run with each helper by the sandbox tests; here, the one deployed.
func TestExecSetupFailure(t *testing.T) {
	needRoot(t)
	d := startDaemon(t)
	ctx := context.Background()
	l := d.acquire("setup-failure")
	// The first exec makes its child cgroup and one spare, p1 and p2 in either order.
	r := must(l.Exec(ctx, apitype.ExecRequest{Argv: []string{"cat", "/proc/self/cgroup"}}))(t)
	var used string
	for _, line := range strings.Split(r.Stdout, "\n") {
		if _, path, ok := strings.Cut(line, l.ID()+"/"); ok {
			used = path
		}
	}
	spare := map[string]string{"p1": "p2", "p2": "p1"}[used]
	if spare == "" {
		t.Fatalf("child cgroup of the first exec not p1 or p2: %q", r.Stdout)
	}
	dirs := cgroupDirs("/sys/fs/cgroup/*/" + d.cfg.CgroupParent + "/" + l.ID())
	if v2 := "/sys/fs/cgroup/" + d.cfg.CgroupParent + "/" + l.ID(); len(dirs) == 0 {
		dirs = []string{v2}
	} else if _, err := os.Stat(filepath.Join(v2, spare)); err == nil {
		dirs = append(dirs, v2)
	}
	// The spare is made in the background: wait until it exists in every hierarchy.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		n := 0
		for _, dir := range dirs {
			if _, err := os.Stat(filepath.Join(dir, spare)); err == nil {
				n++
			}
		}
		if n == len(dirs) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("spare child cgroup %s never appeared under %v", spare, dirs)
		}
	}
	for _, dir := range dirs {
		if err := syscall.Rmdir(filepath.Join(dir, spare)); err != nil {
			t.Fatal(err)
		}
	}
	_, err := l.Exec(ctx, apitype.ExecRequest{Argv: []string{"true"}})
	var apiErr *client.APIError
	if !errors.Is(err, client.ErrSandboxSetupFailed) || !errors.As(err, &apiErr) || apiErr.Status != 500 ||
		!strings.Contains(apiErr.Detail, `"join cgroup"`) {
		t.Fatalf("exec with its cgroup gone: %v, want 500 sandbox_setup_failed at \"join cgroup\"", err)
	}
	// The lease is still usable: the next exec makes a fresh child.
	if r := must(l.Exec(ctx, apitype.ExecRequest{Argv: []string{"true"}}))(t); r.ExitCode != 0 {
		t.Fatalf("exec after the failure: %+v", r)
	}
}

// cgroupDirs globs a lease's cgroup in every v1 hierarchy, once per hierarchy: co-mounted
// controllers appear under several names (cpu and cpuacct are links to cpu,cpuacct).
func cgroupDirs(pattern string) []string {
	matches, _ := filepath.Glob(pattern)
	var dirs []string
	seen := map[string]bool{}
	for _, m := range matches {
		real, err := filepath.EvalSymlinks(m)
		if err != nil || seen[real] {
			continue
		}
		seen[real] = true
		dirs = append(dirs, real)
	}
	return dirs
}
