package disk

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// needLoop skips where loop devices cannot be had: not root, or a host without them.
func needLoop(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for loop devices and mounts (CI runs as root)")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("no loop devices on this host: %v", err)
	}
	if _, err := findMkfs(); err != nil {
		t.Skip(err.Error())
	}
}

// newRoot makes a work root under /var/tmp and, when the test ends, unmounts whatever is
// still mounted under it, clears the loop devices of its images, then checks that
// nothing is left before removing the tree (never through a mount).
func newRoot(t testing.TB) string {
	t.Helper()
	root, err := os.MkdirTemp("/var/tmp", "disk-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ms, _ := mountinfo.GetMounts(nil)
		for i := len(ms) - 1; i >= 0; i-- { // innermost first; the shared work root last
			if ms[i].Mountpoint == root || strings.HasPrefix(ms[i].Mountpoint, root+"/") {
				_ = unix.Unmount(ms[i].Mountpoint, unix.MNT_DETACH)
			}
		}
		imgs, _ := filepath.Glob(filepath.Join(root, ".disk", "*.img"))
		pooled, _ := filepath.Glob(filepath.Join(root, ".disk", "pool", "*.img"))
		for _, img := range append(imgs, pooled...) {
			_ = detachImage(img)
		}
		if _, mounted, _ := mountAt(root); mounted {
			t.Errorf("cannot unmount the work root %s: not removing it", root)
			return
		}
		if left := settled(t, root); len(left) > 0 {
			t.Errorf("left behind: %v (not removing %s)", left, root)
			return
		}
		_ = os.RemoveAll(root)
	})
	return root
}

// leftovers lists the mounts under root and the loop devices bound to a file under it.
func leftovers(t testing.TB, root string) []string {
	t.Helper()
	var left []string
	ms, err := mountinfo.GetMounts(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if strings.HasPrefix(m.Mountpoint, root+"/") {
			left = append(left, "mount "+m.Mountpoint)
		}
	}
	devs, _ := filepath.Glob("/sys/block/loop*")
	for _, d := range devs {
		if b, _ := loopBacking("/dev/" + filepath.Base(d)); strings.HasPrefix(b, root+"/") {
			left = append(left, filepath.Base(d)+" on "+b)
		}
	}
	return left
}

func newQuotas(t testing.TB, root string, defaultBytes int64, pool int) *Quotas {
	t.Helper()
	q, err := New(context.Background(), Config{Mode: ModeLoop, WorkRoot: root, DefaultBytes: defaultBytes, PoolSize: pool, Strict: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Close() })
	return q
}

func leaseDir(t testing.TB, root, id string) string {
	t.Helper()
	dir := filepath.Join(root, id)
	if err := os.Mkdir(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	return dir
}

// ddFile writes up to mib MiB of zeros to path in a child process, as a lease would.
func ddFile(path string, mib int) (string, error) {
	out, err := exec.Command("dd", "if=/dev/zero", "of="+path, "bs=1M", "count="+strconv.Itoa(mib)).CombinedOutput()
	return string(out), err
}

func allocated(t testing.TB, path string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// A process writing past the quota gets ENOSPC near it; the image costs the host at most
// the quota; another lease keeps writing; detach leaves no mount, loop device or image.
func TestLoopQuotaStopsAWriter(t *testing.T) {
	needLoop(t)
	root := newRoot(t)
	q := newQuotas(t, root, 0, -1)
	const quota = 32 << 20
	ctx := context.Background()
	a, b := leaseDir(t, root, "lease-a"), leaseDir(t, root, "lease-b")
	for _, dir := range []string{a, b} {
		if err := q.Attach(ctx, dir, quota); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(filepath.Join(a, "lost+found")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("lost+found left in a fresh lease filesystem: %v", err)
	}
	out, err := ddFile(filepath.Join(a, "big"), 200)
	if err == nil || !strings.Contains(out, "No space left on device") {
		t.Fatalf("dd of 200 MiB into a 32 MiB quota: err %v, output %q", err, out)
	}
	written := allocated(t, filepath.Join(a, "big"))
	// ext4's own metadata (journal, inode tables) takes ~10% of a 32 MiB image.
	if written > quota || written < quota*8/10 {
		t.Errorf("dd wrote %d bytes before ENOSPC, want between 80%% and 100%% of %d", written, quota)
	}
	img := q.imagePath("lease-a")
	if cost := allocated(t, img); cost > quota {
		t.Errorf("the image costs the host %d bytes, more than the quota %d", cost, quota)
	}
	if out, err := ddFile(filepath.Join(b, "ok"), 8); err != nil {
		t.Errorf("lease b cannot write 8 MiB while lease a is full: %v %s", err, out)
	}
	for _, dir := range []string{a, b} {
		if err := q.Detach(ctx, dir); err != nil {
			t.Fatal(err)
		}
		if err := q.Detach(ctx, dir); err != nil {
			t.Fatalf("second detach: %v", err)
		}
	}
	waitGone(t, root)
	if imgs, _ := filepath.Glob(filepath.Join(root, ".disk", "*.img")); len(imgs) > 0 {
		t.Errorf("detach left images %v", imgs)
	}
}

// A busy filesystem (a process still has a file open in it) is unmounted lazily: the
// directory is no mount point after Detach, and the loop device goes with the last user.
func TestDetachBusy(t *testing.T) {
	needLoop(t)
	root := newRoot(t)
	q := newQuotas(t, root, 0, -1)
	ctx := context.Background()
	dir := leaseDir(t, root, "busy")
	if err := q.Attach(ctx, dir, MinBytes); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, "held"))
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Detach(ctx, dir); err != nil {
		t.Fatal(err)
	}
	if _, mounted, _ := mountAt(dir); mounted {
		t.Fatal("still a mount point after detach")
	}
	f.Close()
	waitGone(t, root)
}

// waitGone waits (bounded) for every mount and loop device under root to go.
func waitGone(t testing.TB, root string) {
	t.Helper()
	if left := settled(t, root); len(left) > 0 {
		t.Errorf("left %v", left)
	}
}

// settled is what is left under root once loop devices had up to two minutes to go: a
// loop device clears itself (autoclear) as its last user goes, asynchronously (the
// kernel's rundown runs in a work queue, after the unmount or LOOP_CLR_FD has returned);
// and its last user may be another process's mount namespace made while the filesystem
// was mounted here (a lease of a suite running beside this one: `go test ./...` runs
// packages at once), which keeps the filesystem, and so the device, until it ends. A
// device left for good is still reported.
func settled(t testing.TB, root string) []string {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	left := leftovers(t, root)
	for len(left) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond) // poll
		left = leftovers(t, root)
	}
	return left
}

// After a daemon restart the mount is adopted with its files; after a host reboot (mount
// gone, image kept) the image is mounted again.
func TestAttachAdoptsAndRemounts(t *testing.T) {
	needLoop(t)
	root := newRoot(t)
	ctx := context.Background()
	dir := leaseDir(t, root, "kept")
	q1 := newQuotas(t, root, 0, -1)
	if err := q1.Attach(ctx, dir, 16<<20); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("kept"), 0o600); err != nil {
		t.Fatal(err)
	}
	_ = q1.Close()

	q2 := newQuotas(t, root, 0, -1) // the restarted daemon
	if err := q2.Attach(ctx, dir, 16<<20); err != nil {
		t.Fatal(err)
	}
	if n := countMounts(t, dir); n != 1 {
		t.Fatalf("%d mounts on %s after adopt, want 1", n, dir)
	}
	if err := unix.Unmount(dir, 0); err != nil { // the reboot
		t.Fatal(err)
	}
	if err := q2.Attach(ctx, dir, 16<<20); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "f")); err != nil || string(b) != "kept" {
		t.Fatalf("file after remount: %q %v", b, err)
	}
	if out, err := ddFile(filepath.Join(dir, "big"), 64); err == nil {
		t.Errorf("the remounted filesystem is unbounded: %s", out)
	}
	if err := q2.Detach(ctx, dir); err != nil {
		t.Fatal(err)
	}
}

func countMounts(t testing.TB, dir string) int {
	t.Helper()
	ms, err := mountinfo.GetMounts(nil)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range ms {
		if m.Mountpoint == dir {
			n++
		}
	}
	return n
}

// Sweep removes the filesystems of unknown leases, directory or not, and keeps the known.
// Detach never unmounts what is not the lease's own.
func TestSweepAndForeignMounts(t *testing.T) {
	needLoop(t)
	root := newRoot(t)
	q := newQuotas(t, root, 0, -1)
	ctx := context.Background()
	known, gone := leaseDir(t, root, "known"), leaseDir(t, root, "gone")
	for _, dir := range []string{known, gone} {
		if err := q.Attach(ctx, dir, MinBytes); err != nil {
			t.Fatal(err)
		}
	}
	cut := filepath.Join(root, ".disk", "cut.img.new") // a format a crash cut short
	if err := os.WriteFile(cut, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	swept, err := q.Sweep(ctx, func(id string) bool { return id == "known" })
	if _, err := os.Stat(cut); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the cut format is still there: %v", err)
	}
	if err != nil || len(swept) != 1 || swept[0] != "gone" {
		t.Fatalf("sweep: %v %v", swept, err)
	}
	if _, mounted, _ := mountAt(gone); mounted {
		t.Error("the unknown lease is still mounted")
	}
	if _, mounted, _ := mountAt(known); !mounted {
		t.Error("the known lease lost its mount")
	}
	if err := q.Detach(ctx, known); err != nil {
		t.Fatal(err)
	}

	foreign := leaseDir(t, root, "foreign")
	if err := unix.Mount("tmpfs", foreign, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(foreign, 0)
	if err := q.Detach(ctx, foreign); err == nil {
		t.Error("detach unmounted a tmpfs that is not the lease's")
	} else if !strings.Contains(err.Error(), "mount point of device ") {
		t.Errorf("detach error %q does not name the tmpfs's device", err)
	}
	if err := q.Attach(ctx, foreign, MinBytes); err == nil {
		t.Error("attach adopted a tmpfs as the lease's filesystem")
	}
	if _, mounted, _ := mountAt(foreign); !mounted {
		t.Error("the foreign mount is gone")
	}
	if err := q.Attach(ctx, filepath.Join(root, "..", "x"), MinBytes); err == nil {
		t.Error("attach accepted a directory outside the work root")
	}
}

// The pool keeps images ready, their filesystems mounted ahead and in no mount table; an
// attach of the default size moves one onto the lease's directory, mounted as a made one
// is (nosuid, nodev, discard, no lost+found), on the loop device of the lease's image.
func TestPoolServesDefaultSize(t *testing.T) {
	needLoop(t)
	root := newRoot(t)
	q := newQuotas(t, root, 16<<20, 2)
	waitPool(t, q, 2)
	q.pool.mu.Lock()
	for _, r := range q.pool.ready {
		if r.mnt == nil {
			t.Errorf("pooled image %s not mounted ahead", r.path)
		}
	}
	q.pool.mu.Unlock()
	if m := leftovers(t, root); slices.ContainsFunc(m, func(s string) bool { return strings.HasPrefix(s, "mount ") }) {
		t.Errorf("mounted-ahead filesystems are in the mount table: %v", m)
	}

	dir := leaseDir(t, root, "pooled")
	if err := q.Attach(context.Background(), dir, 16<<20); err != nil {
		t.Fatal(err)
	}
	ms, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(dir))
	if err != nil || len(ms) != 1 {
		t.Fatalf("mounts on %s: %v, %v", dir, ms, err)
	}
	opts := strings.Split(ms[0].Options, ",")
	if !slices.Contains(opts, "nosuid") || !slices.Contains(opts, "nodev") || !strings.Contains(ms[0].VFSOptions, "discard") || ms[0].FSType != "ext4" {
		t.Errorf("pooled mount: %s %s %s, want ext4 nosuid,nodev and discard", ms[0].FSType, ms[0].Options, ms[0].VFSOptions)
	}
	if m, _, _ := mountAt(dir); !q.ours(m, q.imagePath("pooled")) {
		t.Errorf("the mount on %s is not of the lease's image", dir)
	}
	if _, err := os.Lstat(filepath.Join(dir, "lost+found")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("lost+found in a pooled filesystem: %v", err)
	}
	q.pool.mu.Lock()
	ready := len(q.pool.ready)
	q.pool.mu.Unlock()
	if ready != 1 {
		// The filler may have made the replacement already; it cannot have made two.
		waitPool(t, q, 2)
	}
	if err := q.Detach(context.Background(), dir); err != nil {
		t.Fatal(err)
	}
	if left := leftovers(t, dir); len(left) > 0 {
		t.Errorf("detach left %v", left)
	}
}

func waitPool(t testing.TB, q *Quotas, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		q.pool.mu.Lock()
		ready := len(q.pool.ready)
		q.pool.mu.Unlock()
		if ready >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool has %d images after 30s, want %d", ready, n)
		}
		time.Sleep(10 * time.Millisecond) // poll the filler
	}
}

// Off attaches nothing; an unknown mode is refused.
func TestModes(t *testing.T) {
	root := t.TempDir()
	q, err := New(context.Background(), Config{Mode: ModeOff, WorkRoot: root})
	if err != nil || q.Mode() != ModeOff {
		t.Fatalf("off: %v %v", q, err)
	}
	dir := filepath.Join(root, "l")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := q.Attach(context.Background(), dir, 1<<20); err != nil {
		t.Fatal(err)
	}
	if _, mounted, _ := mountAt(dir); mounted {
		t.Fatal("mode off mounted something")
	}
	if _, err := New(context.Background(), Config{Mode: "project", WorkRoot: root}); err == nil {
		t.Error("an unknown mode was accepted")
	}
	if os.Geteuid() != 0 {
		_, err := New(context.Background(), Config{Mode: ModeAuto, WorkRoot: root, Strict: true})
		if !errors.Is(err, ErrUnavailable) {
			t.Errorf("strict auto without root: %v, want ErrUnavailable", err)
		}
	}
}

// BenchmarkAttach measures what an acquire pays for its filesystem, with and without
// ready images: go test -run X -bench Attach ./lease/disk/
func BenchmarkAttach(b *testing.B) {
	needLoop(b)
	for _, bc := range []struct {
		name string
		pool int
	}{{"pool", 4}, {"nopool", -1}} {
		b.Run(bc.name, func(b *testing.B) {
			root := newRoot(b)
			q := newQuotas(b, root, 256<<20, bc.pool)
			ctx := context.Background()
			for i := 0; b.Loop(); i++ {
				if bc.pool > 0 {
					b.StopTimer()
					waitPool(b, q, bc.pool)
					b.StartTimer()
				}
				dir := leaseDir(b, root, "l"+strconv.Itoa(i))
				if err := q.Attach(ctx, dir, 256<<20); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := q.Detach(ctx, dir); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}

// An image whose filesystem is still alive elsewhere (here a second mount of it; in
// production a previous run's mount namespace) is mounted again through the same loop
// device, never attached to a second one.
func TestAttachReusesTheBoundDevice(t *testing.T) {
	needLoop(t)
	root := newRoot(t)
	q := newQuotas(t, root, 0, -1)
	ctx := context.Background()
	dir := leaseDir(t, root, "alive")
	if err := q.Attach(ctx, dir, MinBytes); err != nil {
		t.Fatal(err)
	}
	elsewhere := filepath.Join(root, "elsewhere")
	if err := os.Mkdir(elsewhere, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(dir, elsewhere, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(elsewhere, unix.MNT_DETACH)
	if err := unix.Unmount(dir, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(elsewhere, "f"), []byte("same"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := q.Attach(ctx, dir, MinBytes); err != nil {
		t.Fatal(err)
	}
	if devs, _ := loopsOf(q.imagePath("alive")); len(devs) != 1 {
		t.Fatalf("%d loop devices bound to the image, want 1", len(devs))
	}
	if b, err := os.ReadFile(filepath.Join(dir, "f")); err != nil || string(b) != "same" {
		t.Fatalf("not the same filesystem: %q %v", b, err)
	}
	if err := unix.Unmount(elsewhere, 0); err != nil {
		t.Fatal(err)
	}
	if err := q.Detach(ctx, dir); err != nil {
		t.Fatal(err)
	}
	waitGone(t, root)
}

// Quotas adding up to more than the disk are the design (sparse images), not a fault: a
// start with them logs the figures at info and warns of nothing.
func TestOvercommitIsInfoNotWarning(t *testing.T) {
	needLoop(t)
	root := newRoot(t)
	var logs bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	q, err := New(context.Background(), Config{Mode: ModeLoop, WorkRoot: root, DefaultBytes: 1 << 40, MaxLeases: 64, PoolSize: -1, Strict: true, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Close() })
	var found bool
	for line := range strings.SplitSeq(strings.TrimSpace(logs.String()), "\n") {
		var rec struct {
			Level     string `json:"level"`
			Msg       string `json:"msg"`
			NeedBytes int64  `json:"need_bytes"`
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("%v: %s", err, line)
		}
		if rec.Level == "WARN" || rec.Level == "ERROR" {
			t.Errorf("a start in loop mode logged %s: %s", rec.Level, line)
		}
		if strings.Contains(rec.Msg, "exceed the work root's free space") {
			found = rec.Level == "INFO" && rec.NeedBytes == 64<<40
		}
	}
	if !found {
		t.Fatalf("no info line with the overcommit's figures:\n%s", logs.String())
	}
}
