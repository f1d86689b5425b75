package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkLeaseImageRoot compares, interleaved in one run, a lease on the host's root
// with one in an image and one in the same image as root (AsRoot, its own user namespace
// and id-mapped layers; C helper, launchers on): exec of true, and a whole lease cycle
// (Provision, true, Teardown; directories made and removed outside the timing). Read the
// ratios: "image/host-exec", "root/image-exec" and the same for "-cycle".
func BenchmarkLeaseImageRoot(b *testing.B) {
	layers := rootImage(b)
	s := newTestSandboxWith(b, cHelperPath(b))
	roots := []*LeaseRoot{nil, imageRoot(layers), imageRoot(layers)}
	roots[2].AsRoot = true
	var ids []string
	for _, r := range roots {
		ids = append(ids, newTestLease(b, s, func(l *LeaseSpec) { l.Root = r }).ID)
	}
	// Each iteration starts with the next kind: a command runs while the launchers of the
	// ones before it are being remade, which would otherwise weigh on the last kind only.
	var exec, cycle [3]time.Duration
	for iter := 0; b.Loop(); iter++ {
		for k := range ids {
			i := (iter + k) % len(ids)
			start := time.Now()
			sandboxTrue(b, s, ids[i])
			exec[i] += time.Since(start)
		}
		for k := range roots {
			i := (iter + k) % len(roots)
			cycle[i] += leaseCycle(b, s, roots[i])
		}
	}
	n := float64(b.N)
	for i, name := range []string{"host", "image", "root"} {
		b.ReportMetric(float64(exec[i])/n, name+"-exec-ns/op")
		b.ReportMetric(float64(cycle[i])/n, name+"-cycle-ns/op")
	}
	b.ReportMetric(float64(exec[1])/float64(exec[0]), "image/host-exec")
	b.ReportMetric(float64(cycle[1])/float64(cycle[0]), "image/host-cycle")
	b.ReportMetric(float64(exec[2])/float64(exec[1]), "root/image-exec")
	b.ReportMetric(float64(cycle[2])/float64(cycle[1]), "root/image-cycle")
}

// leaseCycle provisions a lease on root, runs true in it and tears it down, and returns
// how long that took.
func leaseCycle(b *testing.B, s *Sandbox, root *LeaseRoot) time.Duration {
	base, err := os.MkdirTemp("/var/tmp", "sidecar-bench-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(base) // torn down first: nothing mounted under it
	os.Chmod(base, 0o711)
	l := LeaseSpec{ID: "bench-" + filepath.Base(base), UID: 390000, GID: 390000,
		Workdir: filepath.Join(base, "work"), TmpDir: filepath.Join(base, "tmp"), Root: root}
	for _, d := range []string{l.Workdir, l.TmpDir} {
		if err := os.Mkdir(d, 0o700); err != nil {
			b.Fatal(err)
		}
	}
	ctx := context.Background()
	start := time.Now()
	if err := s.Provision(ctx, l); err != nil {
		b.Fatal(err)
	}
	sandboxTrue(b, s, l.ID)
	if err := s.Teardown(ctx, l.ID); err != nil {
		b.Fatal(err)
	}
	if err := s.Retire(ctx, l.ID); err != nil {
		b.Fatal(err)
	}
	return time.Since(start)
}
