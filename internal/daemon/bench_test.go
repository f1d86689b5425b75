package daemon_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/daemon"
	"github.com/sidecar-sandbox/sidecar/lease"
)

// Benchmarks run against the real daemon over real TLS through the real client, next to
// the floor measured in the same run. `go test -bench . -benchtime 200x ./internal/daemon/`.

// BenchmarkNoop is an authenticated request that does nothing: TLS, auth, routing.
func BenchmarkNoop(b *testing.B) {
	d := startDaemon(b)
	ctx := context.Background()
	b.Run("info", func(b *testing.B) {
		for b.Loop() {
			if _, err := d.client.Info(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	l, err := d.client.Acquire(ctx, apitype.AcquireRequest{SessionID: "bench-noop"})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Release(ctx)
	b.Run("lease-get-with-lease-token", func(b *testing.B) {
		lc := d.newClient(l.Token()).OpenLease(l.ID(), l.Token())
		for b.Loop() {
			if _, err := lc.Get(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkAcquireRelease is a whole lease life: state written, cgroup, uid, workdir, and
// a network namespace with the daemon's proxy and resolver in it, beside the same life on
// the host's network; back to back, and 30 ms apart as an agent's leases come (a released
// lease's filesystem is removed in the background, which back to back the next acquire
// shares the machine with). acquire-ms and release-ms are each call's wall time.
func BenchmarkAcquireRelease(b *testing.B) {
	for _, bc := range []struct {
		name, network string
		apart         time.Duration
	}{
		{"network=" + daemon.NetworkNamespace, daemon.NetworkNamespace, 0},
		{"network=" + daemon.NetworkHost, daemon.NetworkHost, 0},
		{"network=" + daemon.NetworkHost + "/30ms-apart", daemon.NetworkHost, 30 * time.Millisecond},
	} {
		b.Run(bc.name, func(b *testing.B) {
			d := startDaemon(b, func(c *daemon.Config) { c.Network.Isolation = bc.network })
			ctx := context.Background()
			var acquire, release time.Duration
			i := 0
			for b.Loop() {
				i++
				t0 := time.Now()
				l, err := d.client.Acquire(ctx, apitype.AcquireRequest{SessionID: fmt.Sprint("bench-", i)})
				if err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if err := l.Release(ctx); err != nil {
					b.Fatal(err)
				}
				acquire, release = acquire+t1.Sub(t0), release+time.Since(t1)
				if bc.apart > 0 {
					b.StopTimer()
					time.Sleep(bc.apart)
					b.StartTimer()
				}
			}
			b.ReportMetric(float64(acquire.Microseconds())/1e3/float64(i), "acquire-ms")
			b.ReportMetric(float64(release.Microseconds())/1e3/float64(i), "release-ms")
		})
	}
}

// BenchmarkAcquireDisk is what an acquire pays for its filesystem (release is not timed):
// none (SIDECAR_DISK_QUOTA=off), a pooled image (the default size), an image made on the
// spot (another size). The pool refills while the untimed release runs.
func BenchmarkAcquireDisk(b *testing.B) {
	for _, bc := range []struct {
		name, mode string
		size       int64
	}{{"off", "off", 0}, {"loop-pooled", "loop", 0}, {"loop-made", "loop", 96 << 20}} {
		b.Run(bc.name, func(b *testing.B) {
			if bc.mode != "off" && os.Geteuid() != 0 {
				b.Skip("loop devices need root")
			}
			d := startDaemon(b, func(c *daemon.Config) { c.DiskQuota = bc.mode })
			ctx := context.Background()
			i := 0
			for b.Loop() {
				i++
				l, err := d.client.Acquire(ctx, apitype.AcquireRequest{SessionID: fmt.Sprint("bench-", i), Limits: apitype.Limits{DiskBytes: bc.size}})
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := l.Release(ctx); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}

// BenchmarkExecTrue is `true` run to completion in a held lease, next to a local fork/exec.
func BenchmarkExecTrue(b *testing.B) {
	b.Run("local-os-exec", func(b *testing.B) {
		for b.Loop() {
			if err := exec.Command("/bin/true").Run(); err != nil {
				b.Fatal(err)
			}
		}
	})
	d := startDaemon(b)
	ctx := context.Background()
	l, err := d.client.Acquire(ctx, apitype.AcquireRequest{SessionID: "bench-exec"})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Release(ctx)
	b.Run("sidecar-client", func(b *testing.B) {
		for b.Loop() {
			res, err := l.Exec(ctx, apitype.ExecRequest{Argv: []string{"/bin/true"}})
			if err != nil || res.ExitCode != 0 {
				b.Fatal(res, err)
			}
		}
	})
}

// BenchmarkAcquireImage is a lease's whole life through the daemon (acquire, `sh -c true`,
// release), interleaved in one run on the host's root, on an image, and on the same image
// as root (SIDECAR_ROOT_IMAGES, C helper), each iteration starting with the next kind.
// Read the ratios "image/host" and "root/image".
func BenchmarkAcquireImage(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("images need root")
	}
	dir := imageLayout(b, map[string]v1.Image{"img": runnableImage(b, "bench")})
	d := startDaemon(b, func(c *daemon.Config) {
		c.Images = daemon.ImageConfig{Images: "img=oci-layout:" + dir + ":img,root=oci-layout:" + dir + ":img", Root: "root", StoreBytes: 256 << 20}
	})
	waitImages(b, d.client)
	took := leaseLives(b, shTrue, 0, life{d, lease.HostImage}, life{d, "img"}, life{d, "root"})
	n := float64(b.N)
	b.ReportMetric(float64(took[0].total())/n, "host-ns/op")
	b.ReportMetric(float64(took[1].total())/n, "image-ns/op")
	b.ReportMetric(float64(took[2].total())/n, "root-ns/op")
	b.ReportMetric(float64(took[1].total())/float64(took[0].total()), "image/host")
	b.ReportMetric(float64(took[2].total())/float64(took[1].total()), "root/image")
}

// life is one kind of lease life a benchmark times: on daemon d, on image ("": the
// daemon's default).
type life struct {
	d     *testDaemon
	image string
}

// phases is what lives of one kind spent acquiring, running their command and releasing.
type phases [3]time.Duration

func (p phases) total() time.Duration { return p[0] + p[1] + p[2] }

// shTrue is the command of a lease life: images have sh, not true.
var shTrue = []string{"sh", "-c", "true"}

// leaseLives runs a lease's whole life (acquire, argv, release) of each kind per
// iteration, interleaved, each iteration starting with the next kind and each life gap
// after the one before (untimed), and returns the time each kind spent in each phase.
func leaseLives(b *testing.B, argv []string, gap time.Duration, lives ...life) []phases {
	ctx := context.Background()
	took := make([]phases, len(lives))
	for iter := 0; b.Loop(); iter++ {
		for k := range lives {
			i := (iter + k) % len(lives)
			if gap > 0 {
				b.StopTimer()
				time.Sleep(gap)
				b.StartTimer()
			}
			t0 := time.Now()
			l, err := lives[i].d.client.Acquire(ctx, apitype.AcquireRequest{SessionID: fmt.Sprint("bench-", iter, "-", i), Image: lives[i].image})
			if err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			if r, err := l.Exec(ctx, apitype.ExecRequest{Argv: argv}); err != nil || r.ExitCode != 0 {
				b.Fatal(r, err)
			}
			t2 := time.Now()
			if err := l.Release(ctx); err != nil {
				b.Fatal(err)
			}
			took[i][0] += t1.Sub(t0)
			took[i][1] += t2.Sub(t1)
			took[i][2] += time.Since(t2)
		}
	}
	return took
}

// BenchmarkAcquireSnapshot: a lease on an image installs SIDECAR_BENCH_SNAPSHOT_MIB
// (default 1024) MiB of files into its root (into its workspace with
// SIDECAR_BENCH_SNAPSHOT_IN=workspace, as a clone with its dependencies) and is saved as a
// snapshot ("save-s"); then a
// lease's whole life (acquire, `sh -c true`, release) on the snapshot and on its base
// image, interleaved. Read "snapshot/image" (issue target ≤ 1.2) and "disk-share": what
// 10 leases held at once on the snapshot take on their disks, of 10 copies of the
// installed files (target ≤ 0.05).
func BenchmarkAcquireSnapshot(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("images need root")
	}
	mib := 1024
	if v := os.Getenv("SIDECAR_BENCH_SNAPSHOT_MIB"); v != "" {
		var err error
		if mib, err = strconv.Atoi(v); err != nil || mib < 16 {
			b.Fatalf("SIDECAR_BENCH_SNAPSHOT_MIB=%q: want a number of MiB, at least 16", v)
		}
	}
	dir := imageLayout(b, map[string]v1.Image{"img": runnableImage(b, "bench")})
	d := startDaemon(b, func(c *daemon.Config) {
		c.Images = daemon.ImageConfig{Images: "img=oci-layout:" + dir + ":img", StoreBytes: int64(mib+256) << 20}
		c.MaxLeases = 16
	})
	waitImages(b, d.client)
	ctx := context.Background()
	src, err := d.client.Acquire(ctx, apitype.AcquireRequest{SessionID: "bench-source", Image: "img", Limits: apitype.Limits{DiskBytes: int64(mib+256) << 20}})
	if err != nil {
		b.Fatal(err)
	}
	defer src.Release(context.Background())
	const chunk = 16 << 20
	if err := src.WriteFile(ctx, "chunk", bytes.Repeat([]byte("installed "), chunk/10), 0o644); err != nil {
		b.Fatal(err)
	}
	into := "/scratch"
	if os.Getenv("SIDECAR_BENCH_SNAPSHOT_IN") == "workspace" {
		into = "/workspace/repo"
	}
	install := fmt.Sprintf(`mkdir -p %[2]s; i=0; while [ $i -lt %[1]d ]; do cat /workspace/chunk > %[2]s/f$i; i=$((i+1)); done; : > /workspace/chunk`, mib*(1<<20)/chunk, into)
	if r, err := src.Exec(ctx, apitype.ExecRequest{Argv: []string{"sh", "-c", install}}); err != nil || r.ExitCode != 0 {
		b.Fatal(r, err)
	}
	start := time.Now()
	if _, err := src.Snapshot(ctx, "snap"); err != nil {
		b.Fatal(err)
	}
	save := time.Since(start)

	took := leaseLives(b, shTrue, 0, life{d, "img"}, life{d, "snap"})
	b.StopTimer()
	var disk int64
	for i := range 10 {
		l, err := d.client.Acquire(ctx, apitype.AcquireRequest{SessionID: fmt.Sprint("bench-held-", i), Image: "snap"})
		if err != nil {
			b.Fatal(err)
		}
		defer l.Release(context.Background())
		if r, err := l.Exec(ctx, apitype.ExecRequest{Argv: []string{"sh", "-c", "cat " + into + "/f0 > /dev/null"}}); err != nil || r.ExitCode != 0 {
			b.Fatal(r, err)
		}
		info, err := d.client.Get(ctx, l.ID())
		if err != nil {
			b.Fatal(err)
		}
		disk += info.Usage.DiskBytes
	}
	n := float64(b.N)
	b.ReportMetric(save.Seconds(), "save-s")
	b.ReportMetric(float64(took[0].total())/n, "image-ns/op")
	b.ReportMetric(float64(took[1].total())/n, "snapshot-ns/op")
	b.ReportMetric(float64(took[1].total())/float64(took[0].total()), "snapshot/image")
	b.ReportMetric(float64(disk)/float64(10*int64(mib)<<20), "disk-share")
}

// BenchmarkLeaseLife is an agent's whole lease: acquire, `true`, release, 300 ms apart
// (the next spare is made 250 ms after one is taken), on a daemon without spare leases
// and on one with SIDECAR_LEASE_SPARES=1, interleaved in one run; on the host's root, and
// on a default image (`sh -c true`: the image has sh, not true), and with a command that
// leaves a process behind for release to kill (`leftover`). Read "spare/plain", and each
// phase's milliseconds.
func BenchmarkLeaseLife(b *testing.B) {
	b.Run("host", func(b *testing.B) { leaseLife(b, []string{"true"}, func(*daemon.Config) {}) })
	b.Run("leftover", func(b *testing.B) {
		leaseLife(b, []string{"sh", "-c", "sleep 1000 & true"}, func(*daemon.Config) {})
	})
	b.Run("image", func(b *testing.B) {
		if os.Geteuid() != 0 {
			b.Skip("images need root")
		}
		dir := imageLayout(b, map[string]v1.Image{"img": runnableImage(b, "bench")})
		leaseLife(b, shTrue, func(c *daemon.Config) {
			c.Images = daemon.ImageConfig{Images: "img=oci-layout:" + dir + ":img", Default: "img", StoreBytes: 256 << 20}
		})
	})
}

func leaseLife(b *testing.B, argv []string, configure func(*daemon.Config)) {
	plain := startDaemon(b, configure, func(c *daemon.Config) { c.CgroupParent += "-plain" })
	spare := startDaemon(b, configure, func(c *daemon.Config) {
		c.CgroupParent += "-spare"
		c.LeaseSpares = 1
		c.UIDFirst, c.UIDLast = 232000, 232999
	})
	for _, d := range []*testDaemon{plain, spare} {
		if d.cfg.Images.Images != "" {
			waitImages(b, d.client)
		}
	}
	took := leaseLives(b, argv, 300*time.Millisecond, life{d: plain}, life{d: spare})
	n := float64(b.N)
	for i, name := range []string{"plain", "spare"} {
		b.ReportMetric(float64(took[i].total())/n/1e6, name+"-ms")
		for p, phase := range []string{"acquire", "exec", "release"} {
			b.ReportMetric(float64(took[i][p])/n/1e6, name+"-"+phase+"-ms")
		}
	}
	b.ReportMetric(float64(took[1].total())/float64(took[0].total()), "spare/plain")
}
