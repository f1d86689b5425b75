package daemon_test

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/match"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/daemon"
	"github.com/sidecar-sandbox/sidecar/internal/daemontest"
)

// TestSpareLease: with SIDECAR_LEASE_SPARES the daemon keeps a lease made ahead, which the
// metrics count. A cleanup leaves it; a default acquire gets it (its directory and cgroup), and its commands run
// confined as any lease's, as its own uid; another spare is made; a lease of another shape
// is made the usual way; stopping the daemon takes the spare down while the leases stay,
// and the next start makes a new one.
func TestSpareLease(t *testing.T) {
	needRoot(t)
	d := startDaemon(t, func(c *daemon.Config) { c.LeaseSpares = 1 })
	ctx := t.Context()
	spare := waitSpare(t, d, nil)
	res := must(d.client.Cleanup(ctx))(t)
	if slices.Contains(res.Cgroups, spare) || slices.Contains(res.Workdirs, spare) {
		t.Fatalf("cleanup took the spare: %+v", res)
	}
	if leases := must(d.client.List(ctx))(t); len(leases) != 0 {
		t.Fatalf("the spare is listed: %+v", leases)
	}

	l := d.acquire("agent")
	if l.ID() != spare {
		t.Fatalf("default acquire made %s; want the spare %s", l.ID(), spare)
	}
	info := must(l.Get(ctx))(t)
	r := must(l.Exec(ctx, apitype.ExecRequest{Argv: []string{"sh", "-c", "id -u; echo hi > /workspace/f; cat /workspace/f"}}))(t)
	lines := strings.Split(r.Stdout, "\n")
	if r.ExitCode != 0 || len(lines) < 3 || lines[0] != strconv.Itoa(info.UID) || lines[1] != "hi" {
		t.Fatalf("exec in the lease from a spare (uid %d): %+v", info.UID, r)
	}
	next := waitSpare(t, d, []string{spare})

	other := must(d.client.Acquire(ctx, apitype.AcquireRequest{SessionID: "other", Limits: apitype.Limits{Pids: 64}}))(t)
	if other.ID() == next {
		t.Fatal("a lease of another shape got the spare")
	}

	d.stop()
	if _, err := os.Stat(filepath.Join(d.cfg.WorkRoot, next)); !os.IsNotExist(err) {
		t.Fatalf("the spare's directory after the daemon stopped: %v", err)
	}
	if cgs := leaseCgroups(d.cfg.CgroupParent); slices.Contains(cgs, next) || !slices.Contains(cgs, spare) {
		t.Fatalf("cgroups after the daemon stopped: %v; want the leases', not the spare's", cgs)
	}
	d.start()
	waitSpare(t, d, []string{spare, other.ID()})
	if got := must(d.client.Get(ctx, spare))(t); got.SessionID != "agent" {
		t.Fatalf("lease after the restart: %+v", got)
	}
}

// waitSpare waits (10 s at most) for the metrics to count one spare, and one lease
// besides those in known with a directory and a cgroup, and returns its id.
func waitSpare(t *testing.T, d *testDaemon, known []string) string {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var got []string
		for _, e := range leaseEntries(d.cfg.WorkRoot) {
			if !slices.Contains(known, e) {
				got = append(got, e)
			}
		}
		_, _, metrics := d.raw("GET", "/metrics", testToken, nil, nil)
		ready := strings.Contains(string(metrics), "\nsidecar_leases{state=\"spare\"} 1\n")
		if ready && len(got) == 1 && slices.Contains(leaseCgroups(d.cfg.CgroupParent), got[0]) {
			return got[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("lease directories %v besides %v (spare counted: %v); want one spare with a cgroup", got, known, ready)
		}
	}
}

// leaseCgroups lists the cgroups under the parent (the first hierarchy's).
func leaseCgroups(parent string) []string {
	ps := daemontest.CgroupParents(parent)
	if len(ps) == 0 {
		return nil
	}
	entries, _ := os.ReadDir(ps[0])
	var names []string
	for _, e := range entries {
		if e.IsDir() {
			names = append(names, e.Name())
		}
	}
	return names
}

// TestSpareOnImage: with a default image, the spare runs on it and the image's listing
// does not count it as a lease using it. Once the image is pulled again with new content,
// the spare made on the old one is taken down and the acquire gets a lease on the new one;
// removing the image takes the spare on it down instead of refusing.
func TestSpareOnImage(t *testing.T) {
	needRoot(t)
	ctx := t.Context()
	dir := imageLayout(t, map[string]v1.Image{"a": runnableImage(t, "alpha")})
	d := startDaemon(t, func(c *daemon.Config) {
		c.Images = daemon.ImageConfig{Images: "alpha=oci-layout:" + dir + ":a", Default: "alpha", StoreBytes: 256 << 20}
		c.LeaseSpares = 1
	})
	if in := waitImages(t, d.client)["alpha"]; in.State != apitype.ImageReady {
		t.Fatalf("image: %+v", in)
	}
	spare := waitSpare(t, d, nil)
	if in := waitImages(t, d.client)["alpha"]; in.InUse != 0 {
		t.Fatalf("the spare counted as a lease using the image: %+v", in)
	}
	osRelease := func(l *client.Lease) string {
		return must(l.Exec(ctx, apitype.ExecRequest{Argv: []string{"cat", "/etc/os-release"}}))(t).Stdout
	}
	a := d.acquire("a")
	if a.ID() != spare || osRelease(a) != "ID=alpha\n" {
		t.Fatalf("lease %s (spare %s) runs on %q", a.ID(), spare, osRelease(a))
	}
	stale := waitSpare(t, d, []string{spare})

	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.ReplaceImage(runnableImage(t, "alpha2"), match.Annotation("org.opencontainers.image.ref.name", "a"),
		layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "a"})); err != nil {
		t.Fatal(err)
	}
	must(d.client.PullImage(ctx, "alpha"))(t)
	waitImages(t, d.client)
	b := d.acquire("b")
	if b.ID() == stale || osRelease(b) != "ID=alpha2\n" {
		t.Fatalf("lease %s (stale spare %s) runs on %q; want a new lease on the new image", b.ID(), stale, osRelease(b))
	}

	for _, l := range []*client.Lease{a, b} {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	spare = waitSpare(t, d, []string{stale})
	if err := d.client.RemoveImage(ctx, "alpha"); err != nil {
		t.Fatalf("remove an image only a spare holds: %v", err)
	}
	waitRetired(t, d.cfg.WorkRoot, spare)
}
