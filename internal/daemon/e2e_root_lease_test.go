package daemon_test

import (
	"context"
	"debug/buildinfo"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/daemon"
	"github.com/sidecar-sandbox/sidecar/internal/testtool"
)

// debImage is an image with a package manager: a static busybox (its dpkg applet) as
// /bin/busybox and /bin/sh, and dpkg's empty database.
func debImage(t *testing.T) v1.Image {
	t.Helper()
	bb := testtool.Need(t, "busybox", "busybox-static", "its dpkg installs the test's package")
	files := map[string]layerFile{
		"bin/busybox": hostFile(t, bb), "bin/sh": hostFile(t, bb),
		"var/lib/dpkg/status": {mode: 0o644}, "var/lib/dpkg/info/": {mode: 0o755},
		"usr/bin/": {mode: 0o755}, "tmp/": {mode: 0o1777},
	}
	layer, err := tarball.LayerFromOpener(layerTar(t, files))
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	if img, err = mutate.Config(img, v1.Config{Env: []string{"PATH=/usr/bin:/bin"}}); err != nil {
		t.Fatal(err)
	}
	return img
}

// helloDeb is a Debian package installing /usr/bin/hello, root-owned.
func helloDeb(t *testing.T) []byte {
	t.Helper()
	dpkgDeb := testtool.Need(t, "dpkg-deb", "dpkg", "it builds the test's package")
	dir := t.TempDir()
	pkg := filepath.Join(dir, "pkg")
	must0(t, os.MkdirAll(filepath.Join(pkg, "DEBIAN"), 0o755))
	must0(t, os.MkdirAll(filepath.Join(pkg, "usr/bin"), 0o755))
	must0(t, os.WriteFile(filepath.Join(pkg, "DEBIAN/control"), []byte("Package: hello-sidecar\nVersion: 1.0\nArchitecture: all\nMaintainer: sidecar tests <tests@sidecar.invalid>\nDescription: a test package\n"), 0o644))
	must0(t, os.WriteFile(filepath.Join(pkg, "usr/bin/hello"), []byte("#!/bin/sh\necho hello from a package\n"), 0o755))
	deb := filepath.Join(dir, "hello.deb")
	if out, err := exec.Command(dpkgDeb, "--root-owner-group", "-Zgzip", "--build", pkg, deb).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb: %v\n%s", err, out)
	}
	b, err := os.ReadFile(deb)
	must0(t, err)
	return b
}

// cHelper says whether the daemon's helper (sidecar-init beside the built daemon) is the C
// one, which root leases need; a Go build carries build information.
func cHelper(t *testing.T) bool {
	_, err := buildinfo.ReadFile(filepath.Join(filepath.Dir(helperBinary(t)), "sidecar-init"))
	return err != nil
}

// An image SIDECAR_ROOT_IMAGES names runs its leases as root in a user namespace: the
// image's package manager installs a package served from the lease's workspace, into that
// lease only. The same image not named there runs them as their uid, and the install is
// refused. With a Go helper, which cannot enter a user namespace, the daemon refuses to
// start, naming the setting.
func TestRootLeasesInstallPackages(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	images := func(img v1.Image) func(c *daemon.Config) {
		dir := imageLayout(t, map[string]v1.Image{"deb": img})
		return func(c *daemon.Config) {
			c.Images = daemon.ImageConfig{Images: "deb=oci-layout:" + dir + ":deb,plain=oci-layout:" + dir + ":deb", Root: "deb", StoreBytes: 256 << 20}
		}
	}
	if !cHelper(t) {
		d := newTestDaemon(t, images(osImage(t, "any")))
		t.Cleanup(d.cleanup) // the cgroup parent the refused start made
		if err := d.tryStart(); err == nil || !strings.Contains(err.Error(), "SIDECAR_ROOT_IMAGES") || !strings.Contains(err.Error(), "C sandbox helper") {
			t.Fatalf("a root image with the Go helper: start = %v; want a refusal naming SIDECAR_ROOT_IMAGES and the C helper", err)
		}
		return
	}
	deb := helloDeb(t)
	d := startDaemon(t, images(debImage(t)))
	for name, in := range waitImages(t, d.client) {
		if in.State != apitype.ImageReady || in.Root != (name == "deb") || !in.Owned {
			t.Fatalf("image %s: %+v", name, in)
		}
	}
	acquire := func(session, img string) *leaseOnImage {
		l := must(d.client.Acquire(ctx, apitype.AcquireRequest{SessionID: session, Image: img}))(t)
		t.Cleanup(func() { _ = l.Release(context.Background()) })
		must0(t, l.WriteFile(ctx, "hello.deb", deb, 0o644))
		return &leaseOnImage{t: t, run: func(script string) apitype.ExecResult { return must(l.Exec(ctx, sh(script)))(t) }, uid: l.Info().UID, lease: l}
	}
	root, root2, plain := acquire("root", "deb"), acquire("root-too", "deb"), acquire("plain", "plain")

	if got := root.out(`busybox id -u; echo $USER; busybox dpkg -i /workspace/hello.deb >/dev/null && hello`); got != "0\nroot\nhello from a package\n" {
		t.Fatalf("an install in a root lease: %q", got)
	}
	if r := root2.run(`busybox test -e /usr/bin/hello`); r.ExitCode == 0 {
		t.Errorf("the package shows in another lease on the same image: %+v", r)
	}
	// Root there or not, no namespace, no module, no other lease's processes.
	for _, l := range []*leaseOnImage{root, plain} {
		for _, cmd := range []string{"busybox unshare -U true", "busybox unshare -m true", "busybox unshare -n true", "busybox insmod /workspace/hello.deb"} {
			if r := l.run(cmd); r.ExitCode == 0 {
				t.Errorf("%s in a lease (uid %d): %+v", cmd, l.uid, r)
			}
		}
	}
	plain.run(`busybox sleep 30 >/dev/null 2>&1 &`)
	if got := root.out(`busybox ps -o user | busybox sort -u`); got != "USER\nroot\n" {
		t.Errorf("the users of the processes a root lease sees: %q; want its own only", got)
	}
	// Not root, the lease still owns the image's files: the package manager installs as
	// its uid, into its own layer, which only a root image's leases are told is root's.
	if got := plain.out(`busybox id -u; busybox dpkg -i /workspace/hello.deb >/dev/null && hello; busybox stat -c %u /usr/bin/hello`); got != strconv.Itoa(plain.uid)+"\nhello from a package\n"+strconv.Itoa(plain.uid)+"\n" {
		t.Errorf("an install in a lease not on a root image: %q; want it done as the lease's uid %d", got, plain.uid)
	}

	// A snapshot of the root lease starts root leases with the package installed, each
	// removing it from its own root only; the image it was taken of still lacks it.
	in := must(root.lease.Snapshot(ctx, "deb-hello"))(t)
	if !in.Root || in.Snapshot == nil || in.Snapshot.Base != "deb" {
		t.Fatalf("a root lease's snapshot: %+v", in)
	}
	for i := range 3 {
		fromSnap := acquire(fmt.Sprint("from-snapshot-", i), "deb-hello")
		if got := fromSnap.out(`busybox id -u; hello; busybox grep -c "Package: hello-sidecar" /var/lib/dpkg/status; busybox stat -c %u /usr/bin/hello; busybox rm /usr/bin/hello && echo removed`); got != "0\nhello from a package\n1\n0\nremoved\n" {
			t.Fatalf("lease %d on the root lease's snapshot: %q", i, got)
		}
	}
	if r := acquire("deb-again", "deb").run(`busybox test -e /usr/bin/hello`); r.ExitCode == 0 {
		t.Errorf("the package shows in a new lease on the image the snapshot was taken of: %+v", r)
	}
}
