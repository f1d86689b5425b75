package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Reference kinds (the prefix of a REF in SIDECAR_IMAGES; none: a registry).
const (
	layoutPrefix  = "oci-layout:"
	archivePrefix = "oci-archive:"
)

// Host is the image name of the host's own root filesystem (read-only), today's
// behaviour. It cannot name an image of SIDECAR_IMAGES.
const Host = "host"

// Entry is one image the operator names: NAME=REF of SIDECAR_IMAGES.
type Entry struct {
	Name, Ref string
}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// CheckName refuses a name that cannot be an image's (it appears in URLs and records).
func CheckName(n string) error {
	if !nameRE.MatchString(n) {
		return fmt.Errorf("image name %q: want 1 to 63 of a-z 0-9 . _ -, starting with a letter or digit", n)
	}
	if n == Host {
		return fmt.Errorf("image name %q is reserved for the host's root filesystem", n)
	}
	return nil
}

// ParseEntries reads SIDECAR_IMAGES: "NAME=REF,NAME=REF". Errors name the variable.
func ParseEntries(s string) ([]Entry, error) {
	var out []Entry
	seen := map[string]bool{}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		n, ref, ok := strings.Cut(item, "=")
		if !ok {
			return nil, fmt.Errorf("SIDECAR_IMAGES: %q is not NAME=REF", item)
		}
		n, ref = strings.TrimSpace(n), strings.TrimSpace(ref)
		if err := CheckName(n); err != nil {
			return nil, fmt.Errorf("SIDECAR_IMAGES: %w", err)
		}
		if seen[n] {
			return nil, fmt.Errorf("SIDECAR_IMAGES: the image name %q is listed twice", n)
		}
		seen[n] = true
		if _, err := parseSource(ref); err != nil {
			return nil, fmt.Errorf("SIDECAR_IMAGES: image %s: %w", n, err)
		}
		out = append(out, Entry{Name: n, Ref: ref})
	}
	return out, nil
}

// source is where a REF's image comes from.
type source struct {
	kind string // "registry", "layout" or "archive"
	path string // layout directory or archive file
	tag  string // layout: the image's org.opencontainers.image.ref.name; "" when it holds one
	ref  name.Reference
}

func parseSource(ref string) (source, error) {
	switch {
	case strings.HasPrefix(ref, layoutPrefix):
		dir, tag := strings.TrimPrefix(ref, layoutPrefix), ""
		if i := strings.LastIndexByte(dir, ':'); i >= 0 && !strings.Contains(dir[i+1:], "/") {
			dir, tag = dir[:i], dir[i+1:]
		}
		if !filepath.IsAbs(dir) {
			return source{}, fmt.Errorf("%q: the OCI layout directory must be an absolute path (oci-layout:/DIR[:TAG])", ref)
		}
		return source{kind: "layout", path: filepath.Clean(dir), tag: tag}, nil
	case strings.HasPrefix(ref, archivePrefix):
		file := strings.TrimPrefix(ref, archivePrefix)
		if !filepath.IsAbs(file) {
			return source{}, fmt.Errorf("%q: the archive must be an absolute path (oci-archive:/FILE)", ref)
		}
		return source{kind: "archive", path: filepath.Clean(file)}, nil
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		return source{}, fmt.Errorf("%q is not a registry reference (registry/repo:tag or registry/repo@sha256:…), an oci-layout: or an oci-archive: path: %v", ref, err)
	}
	return source{kind: "registry", ref: r}, nil
}

// platform is the image a multi-platform reference resolves to here.
func platform() v1.Platform { return v1.Platform{OS: "linux", Architecture: runtime.GOARCH} }

// open resolves the source to one image. tmp is a directory open may unpack an archive
// into; the caller removes it.
func (s source) open(ctx context.Context, tmp string) (v1.Image, error) {
	switch s.kind {
	case "layout":
		return layoutImage(s.path, s.tag)
	case "archive":
		return archiveImage(s.path, tmp)
	}
	return remote.Image(s.ref, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain), remote.WithPlatform(platform()))
}

// refNameAnnotation is how an OCI layout names (tags) the images it holds.
const refNameAnnotation = "org.opencontainers.image.ref.name"

// layoutImage finds the image of an OCI layout: the one tagged tag, or the only one.
// Its manifest is checked against the digest the index gives for it.
func layoutImage(dir, tag string) (v1.Image, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("reading the OCI layout %s: %w", dir, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	var pick *v1.Descriptor
	for i, d := range im.Manifests {
		ref := d.Annotations[refNameAnnotation]
		if tag == "" || ref == tag || strings.HasSuffix(ref, ":"+tag) {
			if pick != nil {
				return nil, fmt.Errorf("the OCI layout %s holds more than one image: name one by its tag (oci-layout:%s:TAG)", dir, dir)
			}
			pick = &im.Manifests[i]
		}
	}
	if pick == nil {
		return nil, fmt.Errorf("the OCI layout %s holds no image tagged %q", dir, tag)
	}
	return imageOf(idx, *pick)
}

// imageOf resolves a descriptor of idx to an image, through a nested index by platform.
func imageOf(idx v1.ImageIndex, d v1.Descriptor) (v1.Image, error) {
	if d.MediaType.IsIndex() {
		child, err := idx.ImageIndex(d.Digest)
		if err != nil {
			return nil, err
		}
		im, err := child.IndexManifest()
		if err != nil {
			return nil, err
		}
		want := platform()
		for _, c := range im.Manifests {
			if c.Platform != nil && c.Platform.Satisfies(want) && c.MediaType.IsImage() {
				return imageOf(child, c)
			}
		}
		return nil, fmt.Errorf("no image for %s/%s in the index %s", want.OS, want.Architecture, d.Digest)
	}
	img, err := idx.Image(d.Digest)
	if err != nil {
		return nil, err
	}
	got, err := img.Digest()
	if err != nil {
		return nil, err
	}
	if got != d.Digest {
		return nil, fmt.Errorf("%w: the manifest's digest is %s, the index says %s", ErrDigest, got, d.Digest)
	}
	return img, nil
}

// archiveImage reads a `docker save` tarball (it has manifest.json) or an OCI layout in
// a tar (it has oci-layout), which is unpacked into tmp first: the layout reader wants
// files.
func archiveImage(file, tmp string) (v1.Image, error) {
	names, err := archiveNames(file)
	if err != nil {
		return nil, err
	}
	switch {
	case names["manifest.json"]:
		return tarball.ImageFromPath(file, nil)
	case names["oci-layout"] && names["index.json"]:
		if err := untarLayout(file, tmp); err != nil {
			return nil, err
		}
		return layoutImage(tmp, "")
	}
	return nil, fmt.Errorf("the archive %s holds neither manifest.json (docker save) nor oci-layout and index.json (an OCI layout)", file)
}

func archiveNames(file string) (map[string]bool, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names := map[string]bool{}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return names, nil
		}
		if err != nil {
			return nil, fmt.Errorf("reading the archive %s: %w", file, err)
		}
		names[path.Clean("/" + hdr.Name)[1:]] = true
	}
}

// untarLayout writes the OCI layout's own files (oci-layout, index.json, blobs/ALG/HEX)
// of the archive into dir, and nothing else.
func untarLayout(file, dir string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading the archive %s: %w", file, err)
		}
		p := path.Clean("/" + hdr.Name)[1:]
		parts := strings.Split(p, "/")
		layoutFile := p == "oci-layout" || p == "index.json" || (len(parts) == 3 && parts[0] == "blobs")
		if hdr.Typeflag != tar.TypeReg || !layoutFile {
			continue
		}
		if err := root.MkdirAll(path.Dir(p), 0o700); err != nil {
			return err
		}
		w, err := root.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			return err
		}
		_, err = io.Copy(w, tr)
		if cerr := w.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
}
