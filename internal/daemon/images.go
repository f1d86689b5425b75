package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/lease"
	"github.com/sidecar-sandbox/sidecar/lease/image"
	"github.com/sidecar-sandbox/sidecar/sidecar"
)

// ImageConfig is the lease images' part of the configuration (lease/image). This is
// where its variables are read and checked.
type ImageConfig struct {
	// Images is SIDECAR_IMAGES: "NAME=REF,NAME=REF" (image.ParseEntries).
	Images string `env:"SIDECAR_IMAGES"`
	// Default is the image of an acquire that names none; "" or "host": the host's root.
	Default string `env:"SIDECAR_DEFAULT_IMAGE"`
	// Root is SIDECAR_ROOT_IMAGES: "NAME,NAME", images whose leases run as root in a user
	// namespace of their own (package installs: sandbox/userns.go).
	Root string `env:"SIDECAR_ROOT_IMAGES"`
	// StoreBytes bounds what the unpacked layers of all images take on disk; 0 (a Config
	// built in code): image.DefaultMaxBytes, as the environment's default.
	StoreBytes int64 `env:"SIDECAR_IMAGE_STORE_BYTES" envDefault:"21474836480"`
	// SnapshotMaxAge removes snapshots this old once no lease runs on them; 0 keeps them
	// until DELETE /v1/images/{name}.
	SnapshotMaxAge time.Duration `env:"SIDECAR_SNAPSHOT_MAX_AGE" envDefault:"0"`
}

// parse checks the configuration: the images listed and the default among them.
func (c ImageConfig) parse() ([]image.Entry, string, error) {
	entries, err := image.ParseEntries(c.Images)
	if err != nil {
		return nil, "", err
	}
	if c.StoreBytes < 0 {
		return nil, "", fmt.Errorf("SIDECAR_IMAGE_STORE_BYTES=%d: want a positive size in bytes (default 21474836480, 20 GiB)", c.StoreBytes)
	}
	if c.SnapshotMaxAge < 0 {
		return nil, "", fmt.Errorf("SIDECAR_SNAPSHOT_MAX_AGE=%s: want a positive duration (168h: a week), or 0 to keep snapshots until removed", c.SnapshotMaxAge)
	}
	def := c.Default
	if def == lease.HostImage {
		def = ""
	}
	for name := range c.rootImages() {
		if !slices.ContainsFunc(entries, func(e image.Entry) bool { return e.Name == name }) {
			return nil, "", fmt.Errorf("SIDECAR_ROOT_IMAGES: %q is not a name of SIDECAR_IMAGES (the host's root never runs leases as root)", name)
		}
	}
	if def != "" {
		listed := false
		for _, e := range entries {
			listed = listed || e.Name == def
		}
		if !listed {
			return nil, "", fmt.Errorf("SIDECAR_DEFAULT_IMAGE=%q is not a name of SIDECAR_IMAGES (nor host, the host's root filesystem)", c.Default)
		}
	}
	return entries, def, nil
}

// rootImages are the names SIDECAR_ROOT_IMAGES lists (parse checks them).
func (c ImageConfig) rootImages() map[string]bool {
	names := map[string]bool{}
	for n := range strings.SplitSeq(c.Root, ",") {
		if n = strings.TrimSpace(n); n != "" {
			names[n] = true
		}
	}
	return names
}

// open opens the image store under the state dir; what it lists is pulled once the
// daemon has restored its leases (Daemon.startImages).
func (c ImageConfig) open(stateDir string, log *slog.Logger) (*image.Store, string, error) {
	entries, def, err := c.parse()
	if err != nil {
		return nil, "", err
	}
	s, err := image.Open(image.Config{
		Dir:            filepath.Join(stateDir, "images"),
		Images:         entries,
		MaxBytes:       c.StoreBytes,
		SnapshotMaxAge: c.SnapshotMaxAge,
		Logger:         log,
	})
	if err != nil {
		return nil, "", err
	}
	return s, def, nil
}

// imageAPI is the store as the HTTP server shows it (sidecar.Images).
type imageAPI struct {
	store        *image.Store
	rt           *Runtime        // whose leases snapshots are taken of
	leases       *lease.Manager  // whose spares hold images too
	defaultImage string          // "": the host's root
	root         map[string]bool // SIDECAR_ROOT_IMAGES
}

var _ sidecar.Images = imageAPI{}

func (a imageAPI) List() apitype.ImageList {
	used, limit := a.store.Usage()
	out := apitype.ImageList{Images: []apitype.ImageInfo{}, DefaultImage: a.defaultImage, UsedBytes: used, LimitBytes: limit}
	if out.DefaultImage == "" {
		out.DefaultImage = lease.HostImage
	}
	for _, in := range a.store.List() {
		out.Images = append(out.Images, a.apiImage(in))
	}
	return out
}

func (a imageAPI) Pull(name string) (apitype.ImageInfo, error) {
	if err := a.store.Pull(name); err != nil {
		return apitype.ImageInfo{}, err
	}
	in, err := a.store.Get(name)
	return a.apiImage(in), err
}

// Remove removes the image; spare leases on it (lease/spare.go), which no one can release,
// are taken down first.
func (a imageAPI) Remove(name string) error {
	err := a.store.Remove(name)
	if errors.Is(err, image.ErrInUse) && a.leases.SparesOn(name) > 0 {
		if err := a.leases.DropSpares(context.Background()); err != nil {
			return err
		}
		err = a.store.Remove(name)
	}
	return err
}

func (a imageAPI) Snapshot(ctx context.Context, l lease.Lease, name string) (apitype.ImageInfo, error) {
	in, err := a.rt.Snapshot(ctx, l, name)
	if err != nil {
		return apitype.ImageInfo{}, err
	}
	return a.apiImage(in), nil
}

func (a imageAPI) apiImage(in image.Info) apitype.ImageInfo {
	out := apitype.ImageInfo{Name: in.Name, Ref: in.Ref, Digest: in.Digest, SizeBytes: in.Size, State: in.State,
		Progress: in.Progress, InUse: max(in.InUse-a.leases.SparesOn(in.Name), 0), Error: in.Error, Root: a.root[in.Name], Owned: a.rt.OwnedImages}
	if sn := in.Snapshot; sn != nil {
		out.Root = a.root[sn.Base] // as its base's, which the operator's setting names
		out.Snapshot = &apitype.SnapshotInfo{Base: sn.Base, Lease: sn.Lease, CreatedAt: sn.Created}
		if !sn.Expires.IsZero() {
			out.Snapshot.ExpiresAt = &sn.Expires
		}
	}
	return out
}
