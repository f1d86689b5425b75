package daemon_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/daemon"
	"github.com/sidecar-sandbox/sidecar/internal/testtool"
)

// A snapshot of a lease starts new leases as that lease left its root, workspace and
// home, each lease then on its own: their workspace and home files are theirs (what the
// lease wrote into its root is root's, as the image's files are), their writes private.
// Where leases own their image, the workspace and home are stacked, not copied. Snapshots
// are listed, survive a restart, are refused a taken name and a lease on the host's root,
// and are removed once no lease runs on them.
func TestSnapshotsStartLeases(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	dir := imageLayout(t, map[string]v1.Image{"a": runnableImage(t, "alpha")})
	d := startDaemon(t, func(c *daemon.Config) {
		c.Images = daemon.ImageConfig{Images: "alpha=oci-layout:" + dir + ":a", StoreBytes: 256 << 20}
	})
	owned := waitImages(t, d.client)["alpha"].Owned
	acquire := func(session, img string) (*client.Lease, *leaseOnImage) {
		l := must(d.client.Acquire(ctx, apitype.AcquireRequest{SessionID: session, Image: img}))(t)
		t.Cleanup(func() { _ = l.Release(context.Background()) })
		return l, &leaseOnImage{t: t, run: func(script string) apitype.ExecResult { return must(l.Exec(ctx, sh(script)))(t) }, uid: l.Info().UID}
	}
	srcLease, src := acquire("source", "alpha")
	src.out(`echo tool > /scratch/tool; mkdir -p /workspace/repo && echo cloned > /workspace/repo/README; echo 'export X=1' > $HOME/.profile`)

	in, err := srcLease.Snapshot(ctx, "prepared")
	if err != nil {
		t.Fatal(err)
	}
	if in.State != apitype.ImageReady || in.Snapshot == nil || in.Snapshot.Base != "alpha" || in.Snapshot.Lease != srcLease.ID() || in.Snapshot.ExpiresAt != nil {
		t.Fatalf("snapshot: %+v %+v", in, in.Snapshot)
	}
	src.out(`echo after > /scratch/later; echo after > /workspace/later`)

	var first *client.Lease
	for i, session := range []string{"first", "second"} {
		cl, l := acquire(session, "prepared")
		if first == nil {
			first = cl
		}
		if got := l.out(`cat /scratch/tool /workspace/repo/README $HOME/.profile /etc/os-release; echo $IMAGE; test -e /scratch/later || test -e /workspace/later || echo "no later writes"`); got != "tool\ncloned\nexport X=1\nID=alpha\nalpha\nno later writes\n" {
			t.Fatalf("lease %d on the snapshot: %q", i, got)
		}
		if got := l.out(`id -u; test -O /workspace/repo/README && test -O $HOME/.profile && echo owned; echo mine >> /workspace/repo/README; echo mine > /scratch/mine`); got != strconv.Itoa(l.uid)+"\nowned\n" {
			t.Fatalf("lease %d: its uid and workspace files: %q", i, got)
		}
	}
	if owned { // what the source lease wrote into the image is the new lease's own
		_, l := acquire("owner", "prepared")
		if got := l.out(`test -O /scratch/tool && echo mine > /scratch/tool && cat /scratch/tool`); got != "mine\n" {
			t.Fatalf("a file the source lease wrote into its root, in a lease on the snapshot: %q", got)
		}
	}
	_, third := acquire("third", "prepared")
	if got := third.out(`cat /scratch/tool /workspace/repo/README; test -e /scratch/mine || echo private`); got != "tool\ncloned\nprivate\n" {
		t.Fatalf("a third lease sees what another lease on the snapshot wrote: %q", got)
	}

	if _, err := srcLease.Snapshot(ctx, "prepared"); !errors.Is(err, client.ErrExists) {
		t.Fatalf("a taken name: %v", err)
	}
	if _, err := srcLease.Snapshot(ctx, "alpha"); !errors.Is(err, client.ErrExists) {
		t.Fatalf("a listed image's name: %v", err)
	}
	if _, err := srcLease.Snapshot(ctx, "Bad Name"); !errors.Is(err, client.ErrInvalidRequest) {
		t.Fatalf("a bad name: %v", err)
	}
	host := must(d.client.Acquire(ctx, apitype.AcquireRequest{SessionID: "on-host", Image: "host"}))(t)
	t.Cleanup(func() { _ = host.Release(context.Background()) })
	if _, err := host.Snapshot(ctx, "host-snap"); !errors.Is(err, client.ErrInvalidRequest) {
		t.Fatalf("a snapshot of a lease on the host's root: %v", err)
	}

	list := must(d.client.ListImages(ctx))(t)
	var found *apitype.ImageInfo
	for i := range list.Images {
		if list.Images[i].Name == "prepared" {
			found = &list.Images[i]
		}
	}
	if found == nil || found.InUse != map[bool]int{false: 3, true: 4}[owned] || found.Snapshot == nil || found.Ref != "snapshot:"+srcLease.ID() {
		t.Fatalf("GET /v1/images: %+v", list)
	}
	if err := d.client.RemoveImage(ctx, "prepared"); !errors.Is(err, client.ErrImageInUse) {
		t.Fatalf("removing a snapshot in use: %v", err)
	}

	// A workspace larger than a new lease's disk: stacked under the lease's own where the
	// lease owns its image (nothing copied, so it starts); copied otherwise, so the acquire
	// is refused, leaving no lease.
	if _, ok := testtool.Find("mkfs.ext4"); ok {
		must0(t, srcLease.WriteFile(ctx, "big", make([]byte, 24<<20), 0o644))
		must(srcLease.Snapshot(ctx, "big"))(t)
		small, err := d.client.Acquire(ctx, apitype.AcquireRequest{SessionID: "small", Image: "big", Limits: apitype.Limits{DiskBytes: 16 << 20}})
		switch {
		case owned && err != nil:
			t.Fatalf("a lease on a snapshot whose workspace is larger than its disk_bytes: %v; want it stacked, not copied", err)
		case owned:
			// Reading it costs the lease nothing; a change would copy it up whole, which
			// this disk would refuse.
			if r := must(small.Exec(ctx, sh(`test -O /workspace/big && cat /workspace/big > /dev/null && echo new > /workspace/new && echo written`)))(t); r.Stdout != "written\n" {
				t.Fatalf("the stacked 24 MiB file on a 16 MiB lease: %+v", r)
			}
			must0(t, small.Release(ctx))
		case !errors.Is(err, client.ErrQuotaExceeded):
			t.Fatalf("a snapshot's workspace over the new lease's disk_bytes: %v", err)
		}
		if got := must(d.client.ListImages(ctx))(t); slices.ContainsFunc(got.Images, func(in apitype.ImageInfo) bool { return in.Name == "big" && in.InUse != 0 }) {
			t.Fatalf("the released or refused lease holds the snapshot: %+v", got)
		}
		must0(t, d.client.RemoveImage(ctx, "big"))
	}

	// Kept across a restart, leases on it restored with what they wrote.
	d.restart()
	if r := must(d.client.OpenLease(first.ID(), first.Token()).Exec(ctx, sh(`cat /workspace/repo/README`)))(t); r.Stdout != "cloned\nmine\n" {
		t.Fatalf("a lease on the snapshot, after a restart: %+v", r)
	}
	_, fourth := acquire("fourth", "prepared")
	if got := fourth.out(`cat /workspace/repo/README`); got != "cloned\n" {
		t.Fatalf("a new lease on the snapshot after a restart: %q", got)
	}
	for _, l := range must(d.client.List(ctx))(t) {
		if l.Image == "prepared" {
			must0(t, d.client.Release(ctx, l.ID))
		}
	}
	must0(t, d.client.RemoveImage(ctx, "prepared"))
	if _, err := d.client.Acquire(ctx, apitype.AcquireRequest{SessionID: "gone", Image: "prepared"}); !errors.Is(err, client.ErrUnknownImage) {
		t.Fatalf("an acquire on a removed snapshot: %v", err)
	}
}
