package image

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"
)

// tfile is one tar entry of a test layer.
type tfile struct {
	name     string
	typ      byte
	body     string
	link     string
	mode     int64
	dev      int64
	uid, gid int
}

func layerTar(t testing.TB, files ...tfile) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: f.name, Typeflag: f.typ, Linkname: f.link, Mode: f.mode, Uid: f.uid, Gid: f.gid,
			Devmajor: f.dev, Devminor: f.dev, ModTime: time.Unix(1700000000, 0), Format: tar.FormatPAX}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
			if h.Typeflag == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(f.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if f.body != "" {
			if _, err := tw.Write([]byte(f.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil && !strings.Contains(err.Error(), "missed writing") {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// rawTar writes a tar whose one file claims size bytes and holds none: the stream ends
// early, which the unpacker must refuse before writing (the size is over the limit).
func rawTar(t *testing.T, name string, size int64) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: size}); err != nil {
		t.Fatal(err)
	}
	// No body: the writer is abandoned; the header alone is what matters.
	return buf.Bytes()
}

func layerOf(t testing.TB, b []byte) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func imageOfLayers(t testing.TB, cfg v1.Config, layers ...[]byte) v1.Image {
	t.Helper()
	img := empty.Image
	for _, b := range layers {
		var err error
		if img, err = mutate.AppendLayers(img, layerOf(t, b)); err != nil {
			t.Fatal(err)
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Config = "linux", platform().Architecture, cfg
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// writeLayout writes images into an OCI layout, tagged.
func writeLayout(t testing.TB, dir string, tagged map[string]v1.Image) {
	t.Helper()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	for tag, img := range tagged {
		if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{refNameAnnotation: tag})); err != nil {
			t.Fatal(err)
		}
	}
}

// writeOCIArchive writes an OCI layout holding img into a tar file.
func writeOCIArchive(t testing.TB, file string, img v1.Image) {
	t.Helper()
	dir := t.TempDir()
	writeLayout(t, dir, map[string]v1.Image{"latest": img})
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	if err := tw.AddFS(os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
}

func writeDockerArchive(t *testing.T, file string, img v1.Image) {
	t.Helper()
	tag, err := name.NewTag("example.test/img:latest")
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(file, tag, img); err != nil {
		t.Fatal(err)
	}
}

func openStore(t testing.TB, dir string, max int64, entries ...Entry) *Store {
	t.Helper()
	s, err := Open(Config{Dir: dir, Images: entries, MaxBytes: max})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// waitPulled waits for name's pull to end and returns its Info.
func waitPulled(t testing.TB, s *Store, name string) Info {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		in, err := s.Get(name)
		if err != nil {
			t.Fatal(err)
		}
		if in.State != StatePulling {
			return in
		}
		if time.Now().After(deadline) {
			t.Fatalf("image %s still pulling: %+v", name, in)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func pullReady(t testing.TB, s *Store, name string) Info {
	t.Helper()
	if err := s.Pull(name); err != nil {
		t.Fatal(err)
	}
	in := waitPulled(t, s, name)
	if in.State != StateReady {
		t.Fatalf("image %s: %+v", name, in)
	}
	return in
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// baseLayer is shared by the test images: a directory to white out, one to make opaque.
func baseLayer(t *testing.T) []byte {
	return layerTar(t,
		tfile{name: "etc/", typ: tar.TypeDir},
		tfile{name: "etc/os-release", body: "ID=base\n"},
		tfile{name: "etc/gone", body: "whited out above\n"},
		tfile{name: "etc/owned", body: "owner and mode kept\n", mode: 0o640, uid: 42, gid: 43},
		tfile{name: "opt/", typ: tar.TypeDir},
		tfile{name: "opt/old", body: "hidden by the opaque dir above\n"},
		tfile{name: "bin/", typ: tar.TypeDir},
		tfile{name: "bin/tool", body: "#!/bin/sh\n", mode: 0o4755},
		tfile{name: "bin/tool2", typ: tar.TypeLink, link: "bin/tool"},
		tfile{name: "bin/sh", typ: tar.TypeSymlink, link: "/usr/bin/dash"},
		tfile{name: "tmp/", typ: tar.TypeDir, mode: 0o1777},
	)
}

func topLayer(t *testing.T, id string) []byte {
	return layerTar(t,
		tfile{name: "etc/os-release", body: "ID=" + id + "\n"},
		tfile{name: "etc/.wh.gone"},
		tfile{name: "opt/.wh..wh..opq"},
		tfile{name: "opt/new", body: "new\n"},
	)
}

func TestPullLayoutAndArchivesShareLayers(t *testing.T) {
	src, store := t.TempDir(), t.TempDir()
	base := baseLayer(t)
	imgA := imageOfLayers(t, v1.Config{Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin", "A=1"}, WorkingDir: "/srv", User: "1000"}, base, topLayer(t, "alpha"))
	imgB := imageOfLayers(t, v1.Config{Env: []string{"B=2"}}, base, topLayer(t, "beta"))
	writeLayout(t, filepath.Join(src, "layout"), map[string]v1.Image{"a": imgA, "b": imgB})
	writeOCIArchive(t, filepath.Join(src, "b.oci.tar"), imgB)
	writeDockerArchive(t, filepath.Join(src, "a.docker.tar"), imgA)

	s := openStore(t, store, 0,
		Entry{"alpha", "oci-layout:" + filepath.Join(src, "layout") + ":a"},
		Entry{"beta", "oci-layout:" + filepath.Join(src, "layout") + ":b"},
		Entry{"beta-archive", "oci-archive:" + filepath.Join(src, "b.oci.tar")},
		Entry{"alpha-docker", "oci-archive:" + filepath.Join(src, "a.docker.tar")},
	)
	s.PullAll()
	for _, n := range []string{"alpha", "beta", "beta-archive", "alpha-docker"} {
		if in := waitPulled(t, s, n); in.State != StateReady || in.Progress != 1 || !strings.HasPrefix(in.Digest, "sha256:") || in.Size <= 0 {
			t.Fatalf("%s: %+v", n, in)
		}
	}
	// Three distinct layers: the shared base and the two tops, each unpacked once.
	if got := dirNames(t, filepath.Join(store, "layers", "sha256")); len(got) != 3 {
		t.Fatalf("layers on disk: %v, want 3", got)
	}
	if got := dirNames(t, filepath.Join(store, "tmp")); len(got) != 0 {
		t.Fatalf("tmp/ holds %v after the pulls", got)
	}
	if a, b := mustInfo(t, s, "beta").Digest, mustInfo(t, s, "beta-archive").Digest; a != b {
		t.Fatalf("the same image from a layout and an archive: %s and %s", a, b)
	}

	rootA, releaseA, err := s.Use("alpha")
	if err != nil {
		t.Fatal(err)
	}
	defer releaseA()
	rootB, releaseB, err := s.Use("beta-archive")
	if err != nil {
		t.Fatal(err)
	}
	defer releaseB()
	if rootA.WorkingDir != "/srv" || rootA.User != "1000" || strings.Join(rootA.Env, " ") != "PATH=/usr/local/bin:/usr/bin:/bin A=1" {
		t.Fatalf("root A config: %+v", rootA)
	}
	if len(rootA.Layers) != 2 || rootA.Layers[1] != rootB.Layers[1] || rootA.Layers[0] == rootB.Layers[0] {
		t.Fatalf("layers A %v, B %v: want top first, the base shared", rootA.Layers, rootB.Layers)
	}
	top, bottom := rootA.Layers[0], rootA.Layers[1]
	if b, _ := os.ReadFile(filepath.Join(top, "etc/os-release")); string(b) != "ID=alpha\n" {
		t.Fatalf("A's os-release: %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(rootB.Layers[0], "etc/os-release")); string(b) != "ID=beta\n" {
		t.Fatalf("B's os-release: %q", b)
	}
	// The whiteout is overlayfs': a 0/0 character device; the opaque dir its xattr.
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(top, "etc/gone"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Fatalf("whiteout: %v, mode %o rdev %d", err, st.Mode, st.Rdev)
	}
	buf := make([]byte, 8)
	if n, err := unix.Lgetxattr(filepath.Join(top, "opt"), opaqueXattr, buf); err != nil || string(buf[:n]) != "y" {
		t.Fatalf("opaque xattr: %q, %v", buf[:n], err)
	}
	if _, err := os.Lstat(filepath.Join(top, "opt/.wh..wh..opq")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the opaque marker was written as a file: %v", err)
	}
	// Set-uid stripped; the sticky bit, symlink text and hard link kept.
	if fi, err := os.Stat(filepath.Join(bottom, "bin/tool")); err != nil || fi.Mode()&os.ModeSetuid != 0 || fi.Mode().Perm() != 0o755 {
		t.Fatalf("bin/tool: %v %v", fi.Mode(), err)
	}
	if fi, err := os.Stat(filepath.Join(bottom, "tmp")); err != nil || fi.Mode()&os.ModeSticky == 0 {
		t.Fatalf("tmp: %v %v", fi.Mode(), err)
	}
	var owned unix.Stat_t
	if err := unix.Stat(filepath.Join(bottom, "etc/owned"), &owned); err != nil || owned.Uid != 42 || owned.Gid != 43 ||
		owned.Mode&0o7777 != 0o640 || owned.Mtim.Sec != 1700000000 {
		t.Fatalf("etc/owned: %v, %d:%d mode %o mtime %d; want 42:43, 0640, 1700000000", err, owned.Uid, owned.Gid, owned.Mode&0o7777, owned.Mtim.Sec)
	}
	if l, err := os.Readlink(filepath.Join(bottom, "bin/sh")); err != nil || l != "/usr/bin/dash" {
		t.Fatalf("bin/sh: %q %v", l, err)
	}
	var st1, st2 unix.Stat_t
	_ = unix.Stat(filepath.Join(bottom, "bin/tool"), &st1)
	_ = unix.Stat(filepath.Join(bottom, "bin/tool2"), &st2)
	if st1.Ino != st2.Ino {
		t.Fatal("the hard link is not one")
	}
	if in := mustInfo(t, s, "alpha"); in.InUse != 1 {
		t.Fatalf("alpha in use: %d", in.InUse)
	}
}

func mustInfo(t *testing.T, s *Store, n string) Info {
	t.Helper()
	in, err := s.Get(n)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

func TestRemoveRefusedInUseThenGC(t *testing.T) {
	src, store := t.TempDir(), t.TempDir()
	base := baseLayer(t)
	writeLayout(t, src, map[string]v1.Image{
		"a": imageOfLayers(t, v1.Config{}, base, topLayer(t, "alpha")),
		"b": imageOfLayers(t, v1.Config{}, base, topLayer(t, "beta")),
	})
	s := openStore(t, store, 0, Entry{"alpha", "oci-layout:" + src + ":a"}, Entry{"beta", "oci-layout:" + src + ":b"})
	pullReady(t, s, "alpha")
	pullReady(t, s, "beta")
	layers := filepath.Join(store, "layers", "sha256")

	_, release, err := s.Use("alpha")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Remove("alpha"); !errors.Is(err, ErrInUse) {
		t.Fatalf("remove in use: %v", err)
	}
	release()
	release() // a second call does nothing
	if err := s.Remove("alpha"); err != nil {
		t.Fatal(err)
	}
	if in := mustInfo(t, s, "alpha"); in.State != StateAbsent || in.Digest != "" {
		t.Fatalf("after remove: %+v", in)
	}
	if _, _, err := s.Use("alpha"); !errors.Is(err, ErrNotReady) {
		t.Fatalf("use after remove: %v", err)
	}
	if got := dirNames(t, layers); len(got) != 2 {
		t.Fatalf("after removing alpha: layers %v, want beta's 2", got)
	}
	if err := s.Remove("beta"); err != nil {
		t.Fatal(err)
	}
	if got := dirNames(t, layers); len(got) != 0 {
		t.Fatalf("after removing both: layers %v", got)
	}
	if s.used != 0 {
		t.Fatalf("store charge after removing everything: %d", s.used)
	}
	// Listed names stay: a pull brings the image back.
	pullReady(t, s, "alpha")
}

func TestReopenAdoptsAndRetires(t *testing.T) {
	src, store := t.TempDir(), t.TempDir()
	writeLayout(t, src, map[string]v1.Image{"a": imageOfLayers(t, v1.Config{}, baseLayer(t), topLayer(t, "alpha"))})
	s := openStore(t, store, 0, Entry{"alpha", "oci-layout:" + src + ":a"})
	want := pullReady(t, s, "alpha")
	s.Close()

	// Listed again: ready at once, no pull.
	s2 := openStore(t, store, 0, Entry{"alpha", "oci-layout:" + src + ":a"})
	if in := mustInfo(t, s2, "alpha"); in.State != StateReady || in.Digest != want.Digest || in.Size != want.Size {
		t.Fatalf("adopted: %+v, want %+v", in, want)
	}
	s2.Close()

	// No longer listed: a restored lease may still use it; it goes when released.
	s3 := openStore(t, store, 0)
	if s3.Known("alpha") {
		t.Fatal("an unlisted image is known")
	}
	_, release, err := s3.Use("alpha")
	if err != nil {
		t.Fatal(err)
	}
	s3.GC()
	if got := dirNames(t, filepath.Join(store, "layers", "sha256")); len(got) != 2 {
		t.Fatalf("layers of a held unlisted image: %v", got)
	}
	release()
	if got := dirNames(t, filepath.Join(store, "layers", "sha256")); len(got) != 0 {
		t.Fatalf("layers after the last lease let go: %v", got)
	}
	if got := dirNames(t, filepath.Join(store, "records")); len(got) != 0 {
		t.Fatalf("records: %v", got)
	}
}

func TestHostileLayersRefusedLeaveNothing(t *testing.T) {
	const limit = 1 << 20
	cases := []struct {
		name  string
		layer func(t *testing.T) []byte
		want  error
	}{
		{"dotdot", func(t *testing.T) []byte {
			return layerTar(t, tfile{name: "etc/../../escaped", body: "x"})
		}, ErrRefused},
		{"absolute symlink then a file through it", func(t *testing.T) []byte {
			return layerTar(t, tfile{name: "evil", typ: tar.TypeSymlink, link: "/etc"}, tfile{name: "evil/passwd", body: "root::0:0::/:/bin/sh\n"})
		}, ErrRefused},
		{"relative symlink out then a file through it", func(t *testing.T) []byte {
			return layerTar(t, tfile{name: "up", typ: tar.TypeSymlink, link: "../../../.."}, tfile{name: "up/tmp/x", body: "x"})
		}, ErrRefused},
		{"device node", func(t *testing.T) []byte {
			return layerTar(t, tfile{name: "dev/", typ: tar.TypeDir}, tfile{name: "dev/sda", typ: tar.TypeBlock, dev: 8})
		}, ErrRefused},
		{"char device", func(t *testing.T) []byte {
			return layerTar(t, tfile{name: "mem", typ: tar.TypeChar, dev: 1})
		}, ErrRefused},
		{"hard link outside", func(t *testing.T) []byte {
			return layerTar(t, tfile{name: "passwd", typ: tar.TypeLink, link: "../../../../etc/passwd"})
		}, ErrRefused},
		{"hard link to a file not in the layer", func(t *testing.T) []byte {
			return layerTar(t, tfile{name: "shadow", typ: tar.TypeLink, link: "/etc/shadow"})
		}, ErrRefused},
		{"10 GiB sparse file past the limit", func(t *testing.T) []byte {
			return rawTar(t, "big", 10<<30)
		}, ErrFull},
		{"many small files past the limit", func(t *testing.T) []byte {
			var fs []tfile
			for i := range 3000 {
				fs = append(fs, tfile{name: fmt.Sprintf("d%d/f%d", i%10, i), body: "x"})
			}
			return layerTar(t, fs...)
		}, ErrFull},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src, store := t.TempDir(), t.TempDir()
			good := layerTar(t, tfile{name: "ok", body: "fine"})
			writeLayout(t, src, map[string]v1.Image{"x": imageOfLayers(t, v1.Config{}, good, c.layer(t))})
			s := openStore(t, store, limit, Entry{"x", "oci-layout:" + src})
			if err := s.Pull("x"); err != nil {
				t.Fatal(err)
			}
			in := waitPulled(t, s, "x")
			if in.State != StateFailed || in.Error == "" {
				t.Fatalf("hostile layer pulled: %+v", in)
			}
			if !strings.Contains(in.Error, c.want.Error()) {
				t.Fatalf("error %q, want %q", in.Error, c.want)
			}
			// The good layer below may stay (GC takes it); the refused one left nothing.
			s.GC()
			for _, d := range []string{"layers/sha256", "tmp", "records"} {
				if got := dirNames(t, filepath.Join(store, d)); len(got) != 0 {
					t.Fatalf("%s holds %v after a refused layer", d, got)
				}
			}
			if s.used != 0 {
				t.Fatalf("store charge after the refusal: %d", s.used)
			}
			if _, err := os.Lstat("/escaped"); err == nil {
				t.Fatal("a file escaped to /escaped")
			}
			if _, _, err := s.Use("x"); !errors.Is(err, ErrNotReady) {
				t.Fatalf("use of a failed image: %v", err)
			}
		})
	}
}

func TestDigestMismatchRefused(t *testing.T) {
	src, store := t.TempDir(), t.TempDir()
	img := imageOfLayers(t, v1.Config{}, layerTar(t, tfile{name: "a", body: "a"}))
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.RootFS.DiffIDs[0] = v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("0", 64)}
	img, err := mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	writeLayout(t, src, map[string]v1.Image{"x": img})
	s := openStore(t, store, 0, Entry{"x", "oci-layout:" + src})
	_ = s.Pull("x")
	if in := waitPulled(t, s, "x"); in.State != StateFailed || !strings.Contains(in.Error, ErrDigest.Error()) {
		t.Fatalf("%+v", in)
	}
	s.GC()
	if got := dirNames(t, filepath.Join(store, "layers", "sha256")); len(got) != 0 {
		t.Fatalf("layers: %v", got)
	}
}

func TestRegistryPull(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	ref := strings.TrimPrefix(srv.URL, "http://") + "/test/img:v1"
	img := imageOfLayers(t, v1.Config{Env: []string{"R=1"}}, baseLayer(t), topLayer(t, "reg"))
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(tag, img); err != nil {
		t.Fatal(err)
	}
	d, _ := img.Digest()
	s := openStore(t, t.TempDir(), 0, Entry{"reg", ref}, Entry{"pinned", strings.TrimSuffix(ref, ":v1") + "@" + d.String()})
	for _, n := range []string{"reg", "pinned"} {
		if in := pullReady(t, s, n); in.Digest != d.String() {
			t.Fatalf("%s digest %s, want %s", n, in.Digest, d)
		}
	}
	root, release, err := s.Use("reg")
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if b, _ := os.ReadFile(filepath.Join(root.Layers[0], "etc/os-release")); string(b) != "ID=reg\n" {
		t.Fatalf("os-release %q", b)
	}
}

func TestParseEntries(t *testing.T) {
	got, err := ParseEntries(" py=python:3.12 , tools=oci-layout:/srv/layout:v2,arch=oci-archive:/srv/a.tar,")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[1].Ref != "oci-layout:/srv/layout:v2" {
		t.Fatalf("%+v", got)
	}
	s, _ := parseSource(got[1].Ref)
	if s.path != "/srv/layout" || s.tag != "v2" {
		t.Fatalf("layout source %+v", s)
	}
	for _, bad := range []string{"py", "host=python", "Py=python", "a=oci-layout:rel/dir", "a=oci-archive:x.tar", "a=python,a=node", "a=UPPER::bad"} {
		if _, err := ParseEntries(bad); err == nil || !strings.Contains(err.Error(), "SIDECAR_IMAGES") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

func TestOtherArchitectureRefused(t *testing.T) {
	src, store := t.TempDir(), t.TempDir()
	img := imageOfLayers(t, v1.Config{}, layerTar(t, tfile{name: "a", body: "a"}))
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.Architecture = "s390x"
	if platform().Architecture == "s390x" {
		cf.Architecture = "riscv64"
	}
	img, err := mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	writeLayout(t, src, map[string]v1.Image{"x": img})
	s := openStore(t, store, 0, Entry{"x", "oci-layout:" + src})
	_ = s.Pull("x")
	if in := waitPulled(t, s, "x"); in.State != StateFailed || !strings.Contains(in.Error, cf.Architecture) {
		t.Fatalf("%+v", in)
	}
}
