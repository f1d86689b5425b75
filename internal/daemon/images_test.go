package daemon

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/sidecar-sandbox/sidecar/lease"
	"github.com/sidecar-sandbox/sidecar/lease/image"
)

// Bad image settings are refused naming the variable that fixes them.
func TestImageConfigErrorsNameTheVariable(t *testing.T) {
	for _, c := range []struct {
		cfg  ImageConfig
		want string
	}{
		{ImageConfig{Images: "py"}, "SIDECAR_IMAGES"},
		{ImageConfig{Images: "py=oci-layout:relative"}, "SIDECAR_IMAGES"},
		{ImageConfig{Images: "host=python:3"}, "SIDECAR_IMAGES"},
		{ImageConfig{Images: "py=python:3", Default: "node"}, "SIDECAR_DEFAULT_IMAGE"},
		{ImageConfig{Default: "py"}, "SIDECAR_DEFAULT_IMAGE"},
		{ImageConfig{StoreBytes: -1}, "SIDECAR_IMAGE_STORE_BYTES"},
		{ImageConfig{Images: "py=python:3", Root: "py,node"}, "SIDECAR_ROOT_IMAGES"},
		{ImageConfig{Root: "host"}, "SIDECAR_ROOT_IMAGES"},
		{ImageConfig{SnapshotMaxAge: -time.Hour}, "SIDECAR_SNAPSHOT_MAX_AGE"},
	} {
		if _, _, err := c.cfg.parse(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error naming %s", c.cfg, err, c.want)
		}
	}
	for _, def := range []string{"", lease.HostImage} {
		if _, got, err := (ImageConfig{Images: "py=python:3", Default: def}).parse(); err != nil || got != "" {
			t.Errorf("default %q: %q %v, want the host's root", def, got, err)
		}
	}
	if _, got, err := (ImageConfig{Images: "py=python:3", Default: "py"}).parse(); err != nil || got != "py" {
		t.Errorf("default py: %q %v", got, err)
	}
}

// The runtime holds a lease's image from provision to teardown, once however often
// provision runs, and rootFor shows the root meanwhile (top layer first).
func TestRuntimeHoldsLeaseImage(t *testing.T) {
	dir := t.TempDir()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	_ = tw.WriteHeader(&tar.Header{Name: "etc/os-release", Mode: 0o644, Size: 3, Typeflag: tar.TypeReg})
	_, _ = tw.Write([]byte("x=1"))
	_ = tw.Close()
	b := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		t.Fatal(err)
	}
	if img, err = mutate.Config(img, v1.Config{Env: []string{"PATH=/bin"}, WorkingDir: "/src", User: "app"}); err != nil {
		t.Fatal(err)
	}
	p, err := layout.Write(filepath.Join(dir, "layout"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	store, _, err := ImageConfig{Images: "img=oci-layout:" + filepath.Join(dir, "layout")}.open(filepath.Join(dir, "state"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	store.PullAll()
	deadline := time.Now().Add(30 * time.Second)
	for in, _ := store.Get("img"); in.State != image.StateReady; in, _ = store.Get("img") {
		if in.State == image.StateFailed || time.Now().After(deadline) {
			t.Fatalf("pull: %+v", in)
		}
		time.Sleep(10 * time.Millisecond)
	}

	rt := &Runtime{Images: store}
	ls := lease.Lease{ID: "l1", Image: "img"}
	for range 2 { // a restart provisions again
		if err := rt.holdImage(ls); err != nil {
			t.Fatal(err)
		}
	}
	root := rt.rootFor("l1")
	if root == nil || len(root.Layers) != 1 || root.WorkingDir != "/src" || root.User != "app" || root.Env[0] != "PATH=/bin" {
		t.Fatalf("root %+v", root)
	}
	if b, err := os.ReadFile(filepath.Join(root.Layers[0], "etc/os-release")); err != nil || string(b) != "x=1" {
		t.Fatalf("layer: %q %v", b, err)
	}
	if in, _ := store.Get("img"); in.InUse != 1 {
		t.Fatalf("in use by %d after two provisions, want 1", in.InUse)
	}
	if rt.rootFor("other") != nil || rt.holdImage(lease.Lease{ID: "host"}) != nil || rt.rootFor("host") != nil {
		t.Fatal("a lease on the host's root has an image root")
	}
	rt.releaseImage("l1")
	rt.releaseImage("l1")
	if in, _ := store.Get("img"); in.InUse != 0 || rt.rootFor("l1") != nil {
		t.Fatalf("after release: in use by %d", in.InUse)
	}
	if err := store.Remove("img"); err != nil {
		t.Fatal(err)
	}
}
