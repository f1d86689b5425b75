package daemon_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/daemontest"
)

// A helper that cannot join its command's cgroup (the spare child cgroup the next exec
// takes is removed under the daemon) fails the exec with sandbox_setup_failed naming the
// step, not with exit 125. On v1 the helper reports it; on v2 the daemon cannot clone
// into it. The lease's launcher, set up ahead (internal/confine/launcher.go), is killed
// first, so that the exec starts the plain way. Run with each helper by the sandbox tests;
// here, the one deployed.
func TestExecSetupFailure(t *testing.T) {
	needRoot(t)
	d := startDaemon(t)
	ctx := context.Background()
	l := d.acquire("setup-failure")
	must(l.Exec(ctx, apitype.ExecRequest{Argv: []string{"true"}}))(t)
	dirs := withChildren(daemontest.LeaseCgroups(d.cfg.CgroupParent, l.ID()))
	// A spare or launcher still being made in the background while the test removes the
	// others can serve the exec after all: then the test tries again.
	var err error
	for attempt := 0; attempt < 10 && err == nil; attempt++ {
		removeSparesAndLauncher(t, dirs, attempt == 0)
		_, err = l.Exec(ctx, apitype.ExecRequest{Argv: []string{"true"}})
		t.Logf("attempt %d: %v", attempt, err)
	}
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

// removeSparesAndLauncher waits for the lease's background work (a spare child cgroup,
// empty, and the next command's launcher, the one process in a child that runs as the
// lease's uid: a zygote runs as root), then removes the spares and kills the launcher, so
// that the next exec starts, plain or forked by the zygote, in a child cgroup that no
// longer exists. After the first attempt it takes what a second brings:
// the daemon may count a removed spare as its next and make none, and it stops making
// launchers that keep dying.
func removeSparesAndLauncher(t *testing.T, dirs []string, first bool) {
	t.Helper()
	var spares []string
	launcher := 0
	wait := time.Second
	if first {
		wait = 10 * time.Second
	}
	for deadline := time.Now().Add(wait); ; time.Sleep(10 * time.Millisecond) {
		spares, launcher = childCgroups(t, dirs)
		if len(spares) > 0 && launcher != 0 {
			break
		}
		if time.Now().After(deadline) {
			if first {
				t.Fatalf("no spare and launcher under %v: %v, %d", dirs, spares, launcher)
			}
			break
		}
	}
	for _, dir := range dirs {
		for _, c := range spares {
			// Busy or gone: a launcher being made took it; the attempt may then succeed.
			if err := syscall.Rmdir(filepath.Join(dir, c)); err != nil && !errors.Is(err, syscall.EBUSY) && !errors.Is(err, syscall.ENOENT) {
				t.Fatal(err)
			}
		}
	}
	if launcher == 0 {
		return
	}
	if err := syscall.Kill(launcher, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		// Gone, or a zombie (the daemon reaps it when the exec finds it dead).
		b, err := os.ReadFile("/proc/" + strconv.Itoa(launcher) + "/stat")
		if _, rest, _ := strings.Cut(string(b), ") "); err != nil || strings.HasPrefix(rest, "Z") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("launcher %d still alive", launcher)
		}
	}
}

// withChildren keeps, of a lease's cgroup directories, those of the hierarchies where its
// commands get child cgroups: v2's one; v1's memory and freezer (in the others a command
// stays in the lease's cgroup).
func withChildren(dirs []string) []string {
	if len(dirs) < 2 {
		return dirs
	}
	var kept []string
	for _, d := range dirs {
		for _, part := range strings.Split(d, "/") {
			if ctrls := strings.Split(part, ","); slices.Contains(ctrls, "memory") || slices.Contains(ctrls, "freezer") {
				kept = append(kept, d)
				break
			}
		}
	}
	return kept
}

// childCgroups lists a lease's empty child cgroups (present in every one of dirs) and the
// pid of the one process found in a child not running as root, if exactly one is.
func childCgroups(t *testing.T, dirs []string) (empty []string, pid int) {
	t.Helper()
	entries, err := os.ReadDir(dirs[0])
	if err != nil {
		t.Fatal(err)
	}
	var pids []string
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		everywhere := true
		for _, dir := range dirs {
			if _, err := os.Stat(filepath.Join(dir, e.Name())); err != nil {
				everywhere = false
			}
		}
		b, err := os.ReadFile(filepath.Join(dirs[0], e.Name(), "cgroup.procs"))
		if err != nil || !everywhere {
			continue
		}
		procs := strings.Fields(string(b))
		if len(procs) == 0 {
			empty = append(empty, e.Name())
		}
		for _, p := range procs {
			if st, err := os.Stat("/proc/" + p); err == nil && st.Sys().(*syscall.Stat_t).Uid != 0 {
				pids = append(pids, p)
			}
		}
	}
	if len(pids) == 1 {
		pid, _ = strconv.Atoi(pids[0])
	}
	return empty, pid
}
