package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// ListImages lists the operator's images (SIDECAR_IMAGES): their state, digest, size
// and the leases on them; shared token only. An acquire names one in
// AcquireRequest.Image.
//
// Images belong to one sidecar: on a fleet the calls below are refused without a request.
func (c *Client) ListImages(ctx context.Context) (apitype.ImageList, error) {
	var out apitype.ImageList
	if err := c.oneSidecar("an image list"); err != nil {
		return out, err
	}
	err := c.doJSON(ctx, request{method: http.MethodGet, path: apitype.RouteImages, idempotent: true}, &out)
	return out, err
}

// PullImage starts a background pull of the image (again, when it is in the store: a
// tag may have moved) and describes it as it starts; ListImages shows its progress. A
// pull already running is left to finish, so it is retried.
func (c *Client) PullImage(ctx context.Context, name string) (apitype.ImageInfo, error) {
	var out apitype.ImageInfo
	if err := c.oneSidecar("a pull"); err != nil {
		return out, err
	}
	err := c.doJSON(ctx, request{method: http.MethodPost, path: imagePath(name) + "/pull", idempotent: true}, &out)
	return out, err
}

// RemoveImage deletes the image from the store; the name stays listed (PullImage
// fetches it again). It is refused with ErrImageInUse while leases run on it.
func (c *Client) RemoveImage(ctx context.Context, name string) error {
	if err := c.oneSidecar("a removal"); err != nil {
		return err
	}
	return c.doJSON(ctx, request{method: http.MethodDelete, path: imagePath(name), idempotent: true}, nil)
}

// Snapshot saves the lease's root as it wrote it (packages installed, files changed),
// its workspace and its home as the image name on the lease's sidecar, on top of the
// image the lease runs on, and returns it ready. Later leases name it in
// AcquireRequest.Image: their root stacks the snapshot's layer (nothing copied), their
// workspace and home start as copies of the lease's. Refused with ErrExists when the name
// is an image's already, ErrInvalidRequest for a lease on the host's root, an APIError with code
// "conflict" when a file changed size while it was read (retry once the writers are done),
// ErrSnapshotRefused for what a layer cannot hold and ErrQuotaExceeded past
// SIDECAR_IMAGE_STORE_BYTES. RemoveImage deletes it.
func (l *Lease) Snapshot(ctx context.Context, name string) (apitype.ImageInfo, error) {
	var out apitype.ImageInfo
	err := l.c.doJSON(ctx, request{method: http.MethodPost, path: leasePath(l.id, "snapshot"), json: apitype.SnapshotRequest{Name: name}, lease: l}, &out)
	return out, err
}

func (c *Client) oneSidecar(what string) error {
	if c.fleet != nil {
		return fmt.Errorf("%w: %s names one sidecar's images; give its URL alone", ErrInvalidRequest, what)
	}
	return nil
}

func imagePath(name string) string { return apitype.RouteImages + "/" + url.PathEscape(name) }
