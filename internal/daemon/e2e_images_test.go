package daemon_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/daemon"
)

// osImage is an image of two layers: a base shared by every osImage and a top with its
// own /etc/os-release.
func osImage(t *testing.T, id string) v1.Image {
	t.Helper()
	img := empty.Image
	for _, files := range []map[string]string{
		{"etc/os-release": "ID=base\n", "bin/true": "#!/bin/sh\n"},
		{"etc/os-release": "ID=" + id + "\n"},
	} {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, n := range []string{"etc/os-release", "bin/true"} {
			body, ok := files[n]
			if !ok {
				continue
			}
			if err := tw.WriteHeader(&tar.Header{Name: n, Mode: 0o755, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
				t.Fatal(err)
			}
			_, _ = tw.Write([]byte(body))
		}
		_ = tw.Close()
		b := buf.Bytes()
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
		if err != nil {
			t.Fatal(err)
		}
		if img, err = mutate.AppendLayers(img, l); err != nil {
			t.Fatal(err)
		}
	}
	img, err := mutate.Config(img, v1.Config{Env: []string{"PATH=/usr/bin:/bin", "IMAGE=" + id}, WorkingDir: "/"})
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// imageLayout writes images into an OCI layout, each tagged with its name.
func imageLayout(t testing.TB, images map[string]v1.Image) string {
	t.Helper()
	dir := t.TempDir()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	for tag, img := range images {
		if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": tag})); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// waitImages polls GET /v1/images until no image is pulling.
func waitImages(t testing.TB, c *client.Client) map[string]apitype.ImageInfo {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		list, err := c.ListImages(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		out, pulling := map[string]apitype.ImageInfo{}, false
		for _, in := range list.Images {
			out[in.Name] = in
			pulling = pulling || in.State == apitype.ImagePulling
		}
		if !pulling {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("images still pulling: %+v", list)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestImagesAPI: the operator's images are pulled at start and listed; an acquire names
// one (or an unknown one, 400; one not in the store, 503 with Retry-After); an image in
// use cannot be removed; removal frees the layers no other image shares, a pull brings
// it back; a restarted daemon's leases hold their images again.
func TestImagesAPI(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	dir := imageLayout(t, map[string]v1.Image{"a": osImage(t, "alpha"), "b": osImage(t, "beta")})
	d := startDaemon(t, func(c *daemon.Config) {
		c.Images = daemon.ImageConfig{
			Images:     "alpha=oci-layout:" + dir + ":a,beta=oci-layout:" + dir + ":b,broken=oci-layout:" + filepath.Join(dir, "missing"),
			StoreBytes: 64 << 20,
		}
	})
	images := waitImages(t, d.client)
	if a := images["alpha"]; a.State != apitype.ImageReady || a.Digest == "" || a.SizeBytes <= 0 || a.Progress != 1 {
		t.Fatalf("alpha: %+v", a)
	}
	if b := images["broken"]; b.State != apitype.ImageFailed || b.Error == "" {
		t.Fatalf("broken: %+v", b)
	}
	layers := filepath.Join(d.cfg.StateDir, "images", "layers", "sha256")
	if n := len(must(os.ReadDir(layers))(t)); n != 3 {
		t.Fatalf("%d layers unpacked, want 3 (the shared base once)", n)
	}

	l, err := d.client.Acquire(ctx, apitype.AcquireRequest{SessionID: "on-alpha", Image: "alpha"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	if got := must(d.client.Get(ctx, l.ID()))(t).Image; got != "alpha" || l.Info().Image != "alpha" {
		t.Fatalf("lease image %q, acquire reply %q, want alpha", got, l.Info().Image)
	}
	if host := d.acquire("on-host"); host.Info().Image != "host" {
		t.Fatalf("a lease without image runs on %q, want host", host.Info().Image)
	}

	status, hdr, body := d.raw("POST", "/v1/leases", testToken, jsonBody(apitype.AcquireRequest{SessionID: "s-unknown", Image: "nope"}), nil)
	wantProblem(t, status, hdr, body, http.StatusBadRequest, apitype.CodeUnknownImage)
	status, hdr, body = d.raw("POST", "/v1/leases", testToken, jsonBody(apitype.AcquireRequest{SessionID: "s-broken", Image: "broken"}), nil)
	wantProblem(t, status, hdr, body, http.StatusServiceUnavailable, apitype.CodeImageNotReady)
	if hdr.Get("Retry-After") == "" {
		t.Fatal("503 image_not_ready without Retry-After")
	}

	if in := waitImages(t, d.client)["alpha"]; in.InUse != 1 {
		t.Fatalf("alpha in use by %d, want 1", in.InUse)
	}
	if err := d.client.RemoveImage(ctx, "alpha"); !errors.Is(err, client.ErrImageInUse) {
		t.Fatalf("removing an image in use: %v", err)
	}
	// A lease token cannot reach the image routes.
	status, hdr, body = d.raw("GET", "/v1/images", l.Token(), nil, nil)
	wantProblem(t, status, hdr, body, http.StatusForbidden, apitype.CodeForbidden)

	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.client.RemoveImage(ctx, "alpha"); err != nil {
		t.Fatal(err)
	}
	if a := waitImages(t, d.client)["alpha"]; a.State != apitype.ImageAbsent || a.Digest != "" || a.InUse != 0 {
		t.Fatalf("alpha after removal: %+v", a)
	}
	if n := len(must(os.ReadDir(layers))(t)); n != 2 {
		t.Fatalf("%d layers after removing alpha, want beta's 2", n)
	}
	status, hdr, body = d.raw("POST", "/v1/leases", testToken, jsonBody(apitype.AcquireRequest{SessionID: "s-removed", Image: "alpha"}), nil)
	wantProblem(t, status, hdr, body, http.StatusServiceUnavailable, apitype.CodeImageNotReady)

	if in, err := d.client.PullImage(ctx, "alpha"); err != nil || in.Name != "alpha" {
		t.Fatalf("pull: %+v %v", in, err)
	}
	if a := waitImages(t, d.client)["alpha"]; a.State != apitype.ImageReady {
		t.Fatalf("alpha after a pull: %+v", a)
	}
	status, hdr, body = d.raw("POST", "/v1/images/nope/pull", testToken, nil, nil)
	wantProblem(t, status, hdr, body, http.StatusNotFound, apitype.CodeNotFound)
	status, hdr, body = d.raw("DELETE", "/v1/images/nope", testToken, nil, nil)
	wantProblem(t, status, hdr, body, http.StatusNotFound, apitype.CodeNotFound)

	// A restarted daemon's lease holds its image again: it cannot be removed.
	lb := d.acquireOnce(apitype.AcquireRequest{SessionID: "on-beta", Image: "beta"})
	d.restart()
	if in := waitImages(t, d.client)["beta"]; in.InUse != 1 || in.State != apitype.ImageReady {
		t.Fatalf("beta after a restart: %+v", in)
	}
	if err := d.client.RemoveImage(ctx, "beta"); !errors.Is(err, client.ErrImageInUse) {
		t.Fatalf("removing beta under a restored lease: %v", err)
	}
	if err := d.client.Release(ctx, lb.ID()); err != nil {
		t.Fatal(err)
	}
	if in := waitImages(t, d.client)["beta"]; in.InUse != 0 {
		t.Fatalf("beta after release: %+v", in)
	}
}
