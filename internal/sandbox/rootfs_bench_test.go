package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkLeaseImageRoot compares, interleaved in one run, a lease on the host's root
// with one in an image (C helper, launchers on): exec of true, and a whole lease cycle
// (Provision, true, Teardown; directories made and removed outside the timing). Read the
// ratios: "image/host-exec" and "image/host-cycle".
func BenchmarkLeaseImageRoot(b *testing.B) {
	layers := newTestImage(b)
	var helper string
	for _, h := range testHelpers {
		if h.name == "c" {
			helper = h.usable(b)
		}
	}
	s := newTestSandboxWith(b, helper)
	roots := []*LeaseRoot{nil, imageRoot(layers)}
	ids := []string{newTestLease(b, s, nil).ID, newTestLease(b, s, func(l *LeaseSpec) { l.Root = roots[1] }).ID}
	var exec, cycle [2]time.Duration
	for b.Loop() {
		for i, id := range ids {
			start := time.Now()
			sandboxTrue(b, s, id)
			exec[i] += time.Since(start)
		}
		for i, root := range roots {
			cycle[i] += leaseCycle(b, s, root)
		}
	}
	n := float64(b.N)
	b.ReportMetric(float64(exec[0])/n, "host-exec-ns/op")
	b.ReportMetric(float64(exec[1])/n, "image-exec-ns/op")
	b.ReportMetric(float64(exec[1])/float64(exec[0]), "image/host-exec")
	b.ReportMetric(float64(cycle[0])/n, "host-cycle-ns/op")
	b.ReportMetric(float64(cycle[1])/n, "image-cycle-ns/op")
	b.ReportMetric(float64(cycle[1])/float64(cycle[0]), "image/host-cycle")
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
	return time.Since(start)
}
