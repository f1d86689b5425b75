package daemon_test

import (
	"context"
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
	"github.com/sidecar-sandbox/sidecar/internal/daemon"
	"github.com/sidecar-sandbox/sidecar/internal/daemontest"
)

// The disk quota is the kernel's: a lease process writing past limits.disk_bytes (in its
// workdir or its /tmp) gets ENOSPC at about the quota, the host pays at most the quota,
// another lease keeps writing, usage stays exact, a daemon restart keeps the quota and
// the files, and release leaves no mount, loop device or image.
func TestDiskQuotaHoldsAgainstProcesses(t *testing.T) {
	needRoot(t)
	needMkfs(t)
	const quota = 48 << 20
	d := startDaemon(t, func(c *daemon.Config) { c.DefaultLimits.DiskBytes = quota })
	ctx := context.Background()
	if info := must(d.client.Info(ctx))(t); info.Capabilities.DiskQuota != "loop" {
		t.Fatalf("info says disk_quota %q, want loop", info.Capabilities.DiskQuota)
	}
	a := d.acquireOnce(apitype.AcquireRequest{SessionID: "disk-a"})
	b := d.acquireOnce(apitype.AcquireRequest{SessionID: "disk-b"})
	dirA := filepath.Join(d.cfg.WorkRoot, a.ID())
	img := filepath.Join(d.cfg.WorkRoot, ".disk", a.ID()+".img")

	dd := func(l *client.Lease, path string, mib int) apitype.ExecResult {
		t.Helper()
		return must(l.Exec(ctx, apitype.ExecRequest{Argv: []string{"dd", "if=/dev/zero", "of=" + path, "bs=1M", "count=" + strconv.Itoa(mib)}}))(t)
	}
	full := func(res apitype.ExecResult, what string) {
		t.Helper()
		if res.ExitCode == 0 || !strings.Contains(res.Stderr, "No space left on device") {
			t.Fatalf("%s: dd of 200 MiB into a %d MiB quota exited %d: %s", what, quota>>20, res.ExitCode, res.Stderr)
		}
	}
	full(dd(a, "big", 200), "workdir")
	size := fileBlocks(t, a, "big")
	// ext4's metadata takes ~10% of a small image: the writer stops between 80% and 100%.
	if size > quota || size < quota*8/10 {
		t.Errorf("dd stopped after %d bytes, want 80-100%% of %d", size, quota)
	}
	if cost := allocatedBytes(t, img); cost > quota {
		t.Errorf("the lease's image costs the host %d bytes, over the quota %d", cost, quota)
	}
	// /tmp is inside the same filesystem: nothing more fits there either.
	full(dd(a, "/tmp/more", 200), "/tmp")
	if res := dd(b, "ok", 16); res.ExitCode != 0 {
		t.Errorf("lease b cannot write 16 MiB next to a full lease a: %s", res.Stderr)
	}

	// Usage is what the files hold (blocks), not the filesystem's overhead.
	want := size + fileBlocks(t, a, "/tmp/more")
	got := must(d.client.Get(ctx, a.ID()))(t).Usage.DiskBytes
	if got < want || got > want+1<<20 {
		t.Errorf("usage.disk_bytes %d, want the files' %d (+ directories)", got, want)
	}

	// A restart keeps the lease's filesystem (the same mount, adopted) and its files.
	d.restart()
	a = d.client.OpenLease(a.ID(), a.Token())
	if n := len(mountsAt(dirA)); n != 1 {
		t.Fatalf("%d mounts on the lease directory after a restart, want 1", n)
	}
	if res := must(a.Exec(ctx, apitype.ExecRequest{Argv: []string{"rm", "big", "/tmp/more"}}))(t); res.ExitCode != 0 {
		t.Fatalf("rm after restart: %s", res.Stderr)
	}
	full(dd(a, "again", 200), "after restart")

	if err := d.client.Release(ctx, a.ID()); err != nil {
		t.Fatal(err)
	}
	if err := d.client.Release(ctx, b.ID()); err != nil {
		t.Fatal(err)
	}
	waitRetired(t, d.cfg.WorkRoot, a.ID(), b.ID())
	if m := daemontest.MountsUnder(d.cfg.WorkRoot); len(m) > 0 {
		t.Errorf("release left mounts %v", m)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(loopsUnder(d.cfg.WorkRoot)) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond) // poll: autoclear runs as the last user goes
	}
	if loops := loopsUnder(d.cfg.WorkRoot); len(loops) > 0 {
		t.Errorf("release left loop devices %v", loops)
	}
	if imgs, _ := filepath.Glob(filepath.Join(d.cfg.WorkRoot, ".disk", "*.img")); len(imgs) > 0 {
		t.Errorf("release left images %v", imgs)
	}
	if _, err := os.Stat(dirA); !os.IsNotExist(err) {
		t.Errorf("release left the lease directory: %v", err)
	}
}

// A lease the state no longer knows (its record lost) still has its filesystem mounted:
// the startup sweep unmounts it and deletes its image before removing the directory.
func TestDiskQuotaOrphanSwept(t *testing.T) {
	needRoot(t)
	needMkfs(t)
	d := startDaemon(t, func(c *daemon.Config) { c.DefaultLimits.DiskBytes = 16 << 20 })
	l := d.acquireOnce(apitype.AcquireRequest{SessionID: "orphan"})
	dir := filepath.Join(d.cfg.WorkRoot, l.ID())
	d.stop()
	if err := os.Remove(filepath.Join(d.cfg.StateDir, "leases.journal")); err != nil {
		t.Fatal(err)
	}
	d.start()
	if m := daemontest.MountsUnder(d.cfg.WorkRoot); len(m) > 0 {
		t.Errorf("the startup sweep left mounts %v", m)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the orphan's directory is still there: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(loopsUnder(d.cfg.WorkRoot)) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond) // poll: autoclear runs as the last user goes
	}
	if loops := loopsUnder(d.cfg.WorkRoot); len(loops) > 0 {
		t.Errorf("the startup sweep left loop devices %v", loops)
	}
}

// fileBlocks is the space a file of the lease holds (st_blocks), read through the
// lease's own stat so the daemon's view is the lease's.
func fileBlocks(t *testing.T, l *client.Lease, path string) int64 {
	t.Helper()
	res := must(l.Exec(context.Background(), apitype.ExecRequest{Argv: []string{"stat", "-c", "%b", path}}))(t)
	n, err := strconv.ParseInt(strings.TrimSpace(res.Stdout), 10, 64)
	if err != nil {
		t.Fatalf("stat %s: %q %s", path, res.Stdout, res.Stderr)
	}
	return n * 512
}

func allocatedBytes(t *testing.T, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

func mountsAt(dir string) []string {
	var at []string
	info, _ := os.ReadFile("/proc/thread-self/mountinfo")
	for line := range strings.SplitSeq(string(info), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == dir {
			at = append(at, f[4])
		}
	}
	return at
}

// loopsUnder lists the loop devices bound to a file under dir, but for the disk pool's
// (dir/.disk/pool/): those hold the filesystems mounted ahead for the next acquires.
func loopsUnder(dir string) []string {
	var found []string
	devs, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range devs {
		b, _ := os.ReadFile(f)
		if strings.HasPrefix(string(b), dir+"/") && !strings.HasPrefix(string(b), filepath.Join(dir, ".disk", "pool")+"/") {
			found = append(found, strings.TrimSpace(string(b)))
		}
	}
	return found
}

// A process of lease B started after lease A was mounted has a copy of A's mount in its
// own mount namespace; releasing A must still unmount it everywhere and free its loop
// device, not wait for B's processes to end.
func TestDiskQuotaReleaseWhileAnotherLeaseRuns(t *testing.T) {
	needRoot(t)
	needMkfs(t)
	d := startDaemon(t, func(c *daemon.Config) { c.DefaultLimits.DiskBytes = 16 << 20 })
	ctx := context.Background()
	a := d.acquireOnce(apitype.AcquireRequest{SessionID: "first"})
	b := d.acquire("second")
	p := must(b.Start(ctx, apitype.StartRequest{ID: "sleeper", Argv: []string{"sleep", "300"}}))(t)
	t.Cleanup(func() { _ = p.Signal(context.Background(), "KILL") })
	if err := d.client.Release(ctx, a.ID()); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(d.cfg.WorkRoot, ".disk", a.ID()+".img")
	deadline := time.Now().Add(10 * time.Second)
	for slices.Contains(loopsUnder(d.cfg.WorkRoot), img) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond) // poll: autoclear runs as the last user goes
	}
	if slices.Contains(loopsUnder(d.cfg.WorkRoot), img) {
		t.Errorf("lease a's loop device is still bound while lease b runs: its mount lives on in b's namespace")
	}
}
