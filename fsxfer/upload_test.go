package fsxfer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// An upload survives a restart of the daemon (a new FS on the same directories) and ends
// byte-identical; nothing is visible in the workdir until it completes.
func TestResumableUploadAcrossRestart(t *testing.T) {
	l := newTestLease(t)
	ctx := context.Background()
	data := randomBytes(5<<20+123, 7)
	sum := sha256.Sum256(data)
	const p = "dir/big.bin"

	f1 := openFS(t, l.config())
	if _, err := f1.UploadOffset(p); !errors.Is(err, ErrNotFound) {
		t.Fatalf("offset before start: %v", err)
	}
	// The first request breaks off after 2 MiB: what arrived is kept.
	off, err := f1.AppendUpload(ctx, p, 0, &failingReader{r: bytes.NewReader(data), n: 2 << 20}, false, WriteOptions{})
	if err == nil || off != 2<<20 {
		t.Fatalf("broken part: offset %d, %v", off, err)
	}
	f1.Close() // the daemon dies

	f2 := openFS(t, l.config())
	off, err = f2.UploadOffset(p)
	if err != nil || off != 2<<20 {
		t.Fatalf("offset after restart: %d, %v", off, err)
	}
	if _, err := f2.AppendUpload(ctx, p, off-1, bytes.NewReader(data[off-1:]), false, WriteOptions{}); !errors.Is(err, ErrOffsetMismatch) {
		t.Fatalf("wrong offset: %v", err)
	}
	if _, err := f2.AppendUpload(ctx, "other", 5, strings.NewReader("x"), false, WriteOptions{}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("resume of nothing: %v", err)
	}
	if off, err = f2.AppendUpload(ctx, p, off, bytes.NewReader(data[off:4<<20]), false, WriteOptions{}); err != nil || off != 4<<20 {
		t.Fatalf("middle part: %d, %v", off, err)
	}
	if _, err := os.Lstat(filepath.Join(l.work, "dir")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("something of the upload is visible before completion")
	}
	off, err = f2.AppendUpload(ctx, p, off, bytes.NewReader(data[off:]), true, WriteOptions{SHA256: sum[:], Mkdirs: true, Mode: 0o600})
	if err != nil || off != int64(len(data)) {
		t.Fatalf("last part: %d, %v", off, err)
	}
	if got := readAll(t, f2, p); !bytes.Equal(got, data) {
		t.Fatal("upload not byte-identical")
	}
	if info, _ := f2.Stat(p); info.Mode != 0o600 {
		t.Fatalf("mode %v", info.Mode)
	}
	if _, err := f2.UploadOffset(p); !errors.Is(err, ErrNotFound) {
		t.Fatalf("upload still pending after completion: %v", err)
	}
	if left := listTree(t, l.uploads); len(left) != 0 {
		t.Fatalf("uploads dir not cleaned: %v", left)
	}
}

func TestResumableUploadFailures(t *testing.T) {
	l := newTestLease(t)
	cfg := l.config()
	cfg.QuotaBytes = 6 << 20
	f := openFS(t, cfg)
	ctx := context.Background()
	data := randomBytes(4<<20, 8)

	// Over the quota: the part that went over leaves nothing, the offset stays.
	off, err := f.AppendUpload(ctx, "q", 0, bytes.NewReader(data), false, WriteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.AppendUpload(ctx, "q", off, bytes.NewReader(data), false, WriteOptions{}); !errors.Is(err, ErrQuota) {
		t.Fatalf("over quota: %v", err)
	}
	if got, _ := f.UploadOffset("q"); got != off {
		t.Fatalf("offset after quota refusal %d, want %d", got, off)
	}
	// The client may give up instead of freeing space: aborting frees the upload's space.
	if err := f.AbortUpload("q"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.UploadOffset("q"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("upload kept after an abort: %v", err)
	}
	if err := f.AbortUpload("q"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second abort: %v", err)
	}
	if off, err = f.AppendUpload(ctx, "q", 0, bytes.NewReader(data), false, WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	// Digest mismatch at completion: the upload is discarded, nothing appears.
	wrong := sha256.Sum256([]byte("no"))
	if _, err := f.AppendUpload(ctx, "q", off, strings.NewReader("tail"), true, WriteOptions{SHA256: wrong[:]}); !errors.Is(err, ErrDigest) {
		t.Fatalf("digest: %v", err)
	}
	if _, err := f.UploadOffset("q"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("upload kept after a digest mismatch: %v", err)
	}
	if left := listTree(t, l.work); len(left) != 0 {
		t.Fatalf("workdir: %v", left)
	}
	// Offset 0 restarts an upload, replacing the stale one.
	if _, err := f.AppendUpload(ctx, "r", 0, strings.NewReader("stale data"), false, WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.AppendUpload(ctx, "r", 0, strings.NewReader("fresh"), true, WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := string(readAll(t, f, "r")); got != "fresh" {
		t.Fatalf("restarted upload: %q", got)
	}
	// Completion onto a directory fails and keeps the upload for another try.
	if err := f.Mkdir("d"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.AppendUpload(ctx, "d", 0, strings.NewReader("x"), true, WriteOptions{}); !errors.Is(err, ErrIsDir) {
		t.Fatalf("complete onto a dir: %v", err)
	}
	if u, err := f.Usage(ctx); err != nil || u > cfg.QuotaBytes {
		t.Fatalf("usage %d, %v", u, err)
	}
	disabled := openFS(t, Config{Workdir: l.work, UID: -1, GID: -1})
	if _, err := disabled.AppendUpload(ctx, "x", 0, strings.NewReader("x"), true, WriteOptions{}); !errors.Is(err, ErrUploadsDisabled) {
		t.Fatalf("without an uploads dir: %v", err)
	}
}

// Two requests appending to one upload at once: one of them is refused.
func TestResumableUploadConcurrentAppend(t *testing.T) {
	l := newTestLease(t)
	f := openFS(t, l.config())
	ctx := context.Background()
	if _, err := f.AppendUpload(ctx, "c", 0, strings.NewReader("0123"), false, WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	first := make(chan error, 1)
	go func() {
		_, err := f.AppendUpload(ctx, "c", 4, pr, false, WriteOptions{})
		first <- err
	}()
	// Wait until the first request holds the upload: its first byte has landed.
	if _, err := pw.Write([]byte("4")); err != nil {
		t.Fatal(err)
	}
	_, err := f.AppendUpload(ctx, "c", 4, strings.NewReader("x"), false, WriteOptions{})
	if !errors.Is(err, ErrOffsetMismatch) {
		t.Fatalf("second appender: %v", err)
	}
	pw.Close()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if off, _ := f.UploadOffset("c"); off != 5 {
		t.Fatalf("offset %d", off)
	}
}

func TestReapUploads(t *testing.T) {
	l := newTestLease(t)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cfg := l.config()
	cfg.Now = func() time.Time { return now }
	cfg.UploadIdle = time.Hour
	f := openFS(t, cfg)
	ctx := context.Background()
	if _, err := f.AppendUpload(ctx, "old", 0, strings.NewReader("old"), false, WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	now = now.Add(50 * time.Minute)
	if _, err := f.AppendUpload(ctx, "new", 0, strings.NewReader("new"), false, WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	n, err := f.ReapUploads(now.Add(30 * time.Minute))
	if err != nil || n != 1 {
		t.Fatalf("reaped %d, %v", n, err)
	}
	if _, err := f.UploadOffset("old"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("old upload: %v", err)
	}
	if off, err := f.UploadOffset("new"); err != nil || off != 3 {
		t.Fatalf("new upload: %d, %v", off, err)
	}
	if left := listTree(t, l.uploads); len(left) != 2 {
		t.Fatalf("uploads dir: %v", left)
	}
}

// An upload sent whole is hashed while it streams: a wrong digest still writes nothing,
// a right one lands the file.
func TestResumableUploadInOneRequest(t *testing.T) {
	l := newTestLease(t)
	f := openFS(t, l.config())
	ctx := context.Background()
	data := randomBytes(3<<20, 9)
	wrong := sha256.Sum256([]byte("no"))
	if _, err := f.AppendUpload(ctx, "one", 0, bytes.NewReader(data), true, WriteOptions{SHA256: wrong[:]}); !errors.Is(err, ErrDigest) {
		t.Fatalf("wrong digest: %v", err)
	}
	if left := listTree(t, l.work); len(left) != 0 {
		t.Fatalf("a digest mismatch left %v", left)
	}
	if left := listTree(t, l.uploads); len(left) != 0 {
		t.Fatalf("a digest mismatch left uploads %v", left)
	}
	sum := sha256.Sum256(data)
	n, err := f.AppendUpload(ctx, "one", 0, bytes.NewReader(data), true, WriteOptions{SHA256: sum[:]})
	if err != nil || n != int64(len(data)) {
		t.Fatalf("upload: %d %v", n, err)
	}
	got, err := os.ReadFile(filepath.Join(l.work, "one"))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("uploaded file differs: %v", err)
	}
}

// The digest of a file the daemon wrote with a digest is remembered, as long as the file
// is unchanged (root only: the cache lives in a trusted xattr).
func TestDigestIsRemembered(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the digest cache is a trusted.* xattr, which needs CAP_SYS_ADMIN (CI runs as root)")
	}
	l := newTestLease(t)
	f := openFS(t, l.config())
	ctx := context.Background()
	data := randomBytes(1<<20, 3)
	sum := sha256.Sum256(data)
	if _, err := f.WriteFile(ctx, "w", bytes.NewReader(data), WriteOptions{SHA256: sum[:]}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.AppendUpload(ctx, "u", 0, bytes.NewReader(data), true, WriteOptions{SHA256: sum[:]}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"w", "u"} {
		h, err := f.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		if got := h.SHA256(); !bytes.Equal(got, sum[:]) {
			t.Errorf("%s: remembered digest %x, want %x", name, got, sum)
		}
		h.Close()
	}
	// A change to the file invalidates it.
	if err := os.WriteFile(filepath.Join(l.work, "w"), []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	h, err := f.Open("w")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if got := h.SHA256(); got != nil {
		t.Fatalf("digest survived a change: %x", got)
	}
}
