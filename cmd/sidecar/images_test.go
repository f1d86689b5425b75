package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

func TestParseNewLeaseImage(t *testing.T) {
	got, err := parseNewLease([]string{"sess-1", "--image", "python"})
	if err != nil {
		t.Fatal(err)
	}
	if got.req.Image != "python" {
		t.Fatalf("image %q, want python", got.req.Image)
	}
	if got, _ := parseNewLease([]string{"sess-1"}); got.req.Image != "" {
		t.Fatalf("no --image: %q, want the daemon's default (empty)", got.req.Image)
	}
}

func TestImageTable(t *testing.T) {
	var buf bytes.Buffer
	err := writeImageTable(&buf, apitype.ImageList{
		Images: []apitype.ImageInfo{
			{Name: "py", Ref: "python:3.12", Digest: "sha256:0123456789abcdef0123", SizeBytes: 3 << 20, State: apitype.ImageReady, InUse: 2, Root: true},
			{Name: "node", Ref: "node:22", State: apitype.ImagePulling, Progress: 0.25},
			{Name: "bad", Ref: "oci-layout:/nope", State: apitype.ImageFailed, Error: "no such directory"},
			{Name: "prepared", Ref: "snapshot:L1", State: apitype.ImageReady, Snapshot: &apitype.SnapshotInfo{Base: "py", Lease: "L1"}},
		},
		DefaultImage: "py", UsedBytes: 3 << 20, LimitBytes: 20 << 30,
	})
	if err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"NAME", "ROOT", "py", "ready", " yes ", "sha256:0123456789ab ", "python:3.12", "pulling 25%", "failed: no such directory", "snapshot of L1 on py", "default: py"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestImagesUsage(t *testing.T) {
	for _, bad := range [][]string{{"pull"}, {"rm", "a", "b"}, {"ls", "x"}, {"frob"}} {
		if err := runImages(t.Context(), bad); err == nil {
			t.Errorf("images %q accepted", bad)
		}
	}
	for _, bad := range [][]string{{"snapshot"}, {"snapshot", "L1"}, {"snapshot", "L1", "a", "b"}} {
		if err := runLeases(t.Context(), bad); !errors.As(err, new(usageError)) {
			t.Errorf("leases %q: %v, want a usage error", bad, err)
		}
	}
}
