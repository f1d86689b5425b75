package daemon_test

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/daemon"
	"github.com/sidecar-sandbox/sidecar/internal/testtool"
)

// runnableImage is an image a lease can run commands in: a base layer of host programs
// and their libraries, a world-writable /scratch, and a top layer with
// an /etc/os-release of its own. Its Env sets PATH and IMAGE=id.
func runnableImage(t testing.TB, id string) v1.Image {
	t.Helper()
	base := map[string]layerFile{"scratch/": {mode: 0o1777}, "tmp/": {mode: 0o1777}}
	for _, name := range []string{"sh", "cat", "ls", "id", "touch", "test", "pwd", "mkdir"} {
		host, err := exec.LookPath(name)
		if err != nil {
			t.Fatal(err)
		}
		base["bin/"+name] = hostFile(t, host)
		for _, lib := range testtool.Libraries(t, host) {
			base[strings.TrimPrefix(lib, "/")] = hostFile(t, lib)
		}
	}
	img := empty.Image
	for _, files := range []map[string]layerFile{base, {"etc/os-release": {body: "ID=" + id + "\n", mode: 0o644}}} {
		layer, err := tarball.LayerFromOpener(layerTar(t, files))
		if err != nil {
			t.Fatal(err)
		}
		if img, err = mutate.AppendLayers(img, layer); err != nil {
			t.Fatal(err)
		}
	}
	img, err := mutate.Config(img, v1.Config{Env: []string{"PATH=/bin", "IMAGE=" + id}})
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// layerFile is a regular file of a test layer, or a directory when its name ends in /.
type layerFile struct {
	body string
	mode int64
}

func hostFile(t testing.TB, path string) layerFile {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return layerFile{body: string(b), mode: 0o755}
}

// layerTar is a tar of files, parents made as directories, in a stable order.
func layerTar(t testing.TB, files map[string]layerFile) tarball.Opener {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		f := files[n]
		parts := strings.Split(strings.TrimSuffix(n, "/"), "/")
		for i := 1; i < len(parts); i++ {
			d := strings.Join(parts[:i], "/") + "/"
			if !dirs[d] {
				dirs[d] = true
				must0(t, tw.WriteHeader(&tar.Header{Name: d, Mode: 0o755, Typeflag: tar.TypeDir}))
			}
		}
		if strings.HasSuffix(n, "/") {
			dirs[n] = true
			must0(t, tw.WriteHeader(&tar.Header{Name: n, Mode: f.mode, Typeflag: tar.TypeDir}))
			continue
		}
		must0(t, tw.WriteHeader(&tar.Header{Name: n, Mode: f.mode, Size: int64(len(f.body)), Typeflag: tar.TypeReg}))
		_, _ = tw.Write([]byte(f.body))
	}
	must0(t, tw.Close())
	b := buf.Bytes()
	return func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
}

func must0(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestLeasesRunInTheirImages: each lease sees its image's files, not the host's; its
// /workspace, uid and environment are as on the host root; what one lease writes into
// the image is its own and gone at release.
func TestLeasesRunInTheirImages(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	dir := imageLayout(t, map[string]v1.Image{"a": runnableImage(t, "alpha"), "b": runnableImage(t, "beta")})
	d := startDaemon(t, func(c *daemon.Config) {
		c.Images = daemon.ImageConfig{Images: "alpha=oci-layout:" + dir + ":a,beta=oci-layout:" + dir + ":b", StoreBytes: 256 << 20}
	})
	owned := cHelper(t) && idMappable(t, d.cfg.StateDir)
	for name, in := range waitImages(t, d.client) {
		if in.State != apitype.ImageReady || in.Owned != owned {
			t.Fatalf("image %s: %+v; want it ready, owned %v (the C helper, a store that takes id-mapped mounts)", name, in, owned)
		}
	}
	acquire := func(session, img string) *leaseOnImage {
		l := must(d.client.Acquire(ctx, apitype.AcquireRequest{SessionID: session, Image: img}))(t)
		t.Cleanup(func() { _ = l.Release(context.Background()) })
		return &leaseOnImage{t: t, run: func(script string) apitype.ExecResult { return must(l.Exec(ctx, sh(script)))(t) }, uid: l.Info().UID}
	}
	a, b := acquire("on-alpha", "alpha"), acquire("on-beta", "beta")
	if got := a.out(`cat /etc/os-release; echo $IMAGE`); got != "ID=alpha\nalpha\n" {
		t.Fatalf("alpha's lease: %q", got)
	}
	if got := b.out(`cat /etc/os-release; echo $IMAGE`); got != "ID=beta\nbeta\n" {
		t.Fatalf("beta's lease: %q", got)
	}
	// The host's root is out of sight: the daemon's own state dir, a host program.
	if got := a.out(`test -e ` + d.cfg.StateDir + ` && echo state; test -e /usr/bin/env && echo env; echo done`); got != "done\n" {
		t.Fatalf("the host's files in an image lease: %q", got)
	}
	if got := a.out(`id -u; pwd; echo hi > note; cat /workspace/note`); got != strconv.Itoa(a.uid)+"\n/workspace\nhi\n" {
		t.Fatalf("uid, cwd and workspace: %q", got)
	}
	// A private writable layer: alpha's second lease does not see the first one's file.
	a.out(`echo mine > /scratch/file`)
	if got := a.out(`cat /scratch/file`); got != "mine\n" {
		t.Fatalf("the writer's own file: %q", got)
	}
	a2 := acquire("on-alpha-too", "alpha")
	if got := a2.out(`test -e /scratch/file && echo seen; echo done`); got != "done\n" {
		t.Fatalf("another lease on the same image: %q", got)
	}
	// Owned (id-mapped layers), the lease changes the image's files in its own layer as
	// root in a container would; else they are root's, read-only to it.
	if !owned {
		if r := a.run(`echo no > /etc/os-release`); r.ExitCode == 0 {
			t.Fatalf("the image's /etc is writable by a lease that does not own the image: %+v", r)
		}
		return
	}
	if got := a.out(`echo ID=mine > /etc/os-release; cat /etc/os-release; ls -ln /etc/os-release`); !strings.HasPrefix(got, "ID=mine\n") || !strings.Contains(got, " "+strconv.Itoa(a.uid)+" ") {
		t.Fatalf("an owned image's file, changed: %q", got)
	}
	if got := a2.out(`cat /etc/os-release`); got != "ID=alpha\n" {
		t.Fatalf("another lease on the image sees the change: %q", got)
	}
}

// idMappable says whether dir's filesystem takes id-mapped mounts: tmpfs only from Linux
// 6.3 (the VM tests' kernel is older); the disk filesystems tests run on, always.
func idMappable(t testing.TB, dir string) bool {
	var st unix.Statfs_t
	must0(t, unix.Statfs(dir, &st))
	if st.Type != unix.TMPFS_MAGIC {
		return true
	}
	var u unix.Utsname
	must0(t, unix.Uname(&u))
	var major, minor int
	fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &major, &minor)
	return major > 6 || major == 6 && minor >= 3
}

type leaseOnImage struct {
	t     *testing.T
	run   func(script string) apitype.ExecResult
	uid   int
	lease *client.Lease
}

// out runs script and returns its stdout, failing the test on a non-zero exit.
func (l *leaseOnImage) out(script string) string {
	l.t.Helper()
	r := l.run(script)
	if r.ExitCode != 0 {
		l.t.Fatalf("%s: %+v", script, r)
	}
	return r.Stdout
}
