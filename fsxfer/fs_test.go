package fsxfer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// testLease is a lease directory as the lease package lays it out: work/ (the workdir),
// uploads/, and a sibling "outside" tree that nothing may touch.
type testLease struct {
	base, dir, work, uploads, outside string
}

func newTestLease(t testing.TB) testLease {
	t.Helper()
	base := t.TempDir()
	l := testLease{
		base:    base,
		dir:     filepath.Join(base, "lease"),
		work:    filepath.Join(base, "lease", "work"),
		uploads: filepath.Join(base, "lease", "uploads"),
		outside: filepath.Join(base, "outside"),
	}
	writeTree(t, base, map[string]string{"lease/work/": "", "outside/secret.txt": "secret", "outside/dir/": ""})
	return l
}

func (l testLease) config() Config {
	return Config{Workdir: l.work, UploadsDir: l.uploads, UsageRoot: l.dir, UID: -1, GID: -1}
}

func openFS(t testing.TB, cfg Config) *FS {
	t.Helper()
	f, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func randomBytes(n int, seed uint64) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	for i := n &^ 7; i < n; i++ {
		b[i] = byte(r.Uint32())
	}
	return b
}

func readAll(t testing.TB, f *FS, p string) []byte {
	t.Helper()
	h, err := f.Open(p)
	if err != nil {
		t.Fatalf("Open(%q): %v", p, err)
	}
	defer h.Close()
	b, err := io.ReadAll(h)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func assertOutsideUntouched(t testing.TB, l testLease) {
	t.Helper()
	if got := strings.Join(listTree(t, l.outside), ","); got != "dir/,secret.txt" {
		t.Fatalf("outside tree changed: %s", got)
	}
	if b, _ := os.ReadFile(filepath.Join(l.outside, "secret.txt")); string(b) != "secret" {
		t.Fatalf("outside file changed: %q", b)
	}
}

func TestCleanPath(t *testing.T) {
	long := strings.Repeat("a/", 2100)
	for _, tc := range []struct {
		in, want string
		err      error
	}{
		{"", ".", nil},
		{".", ".", nil},
		{"./", ".", nil},
		{"a", "a", nil},
		{"a//b/./c/", "a/b/c", nil},
		{"ünï/ファイル", "ünï/ファイル", nil},
		{"..", "", ErrOutside},
		{"../x", "", ErrOutside},
		{"a/../b", "", ErrOutside},
		{"a/..", "", ErrOutside},
		{"/etc/passwd", "", ErrOutside},
		{"/", "", ErrOutside},
		{"a\x00b", "", ErrOutside},
		{long, "", ErrNameTooLong},
		{strings.Repeat("n", 256), "", ErrNameTooLong},
		{strings.Repeat("n", 255), strings.Repeat("n", 255), nil},
	} {
		got, err := cleanPath(tc.in, DefaultMaxNameBytes)
		if !errors.Is(err, tc.err) || got != tc.want {
			t.Errorf("cleanPath(%.40q) = %.40q, %v; want %.40q, %v", tc.in, got, err, tc.want, tc.err)
		}
	}
}

func TestWriteFileRoundTrip(t *testing.T) {
	l := newTestLease(t)
	f := openFS(t, l.config())
	ctx := context.Background()
	big := randomBytes(64<<20, 1)
	sparse := make([]byte, 24<<20)
	copy(sparse[10<<20:], randomBytes(5000, 2)) // data between two holes, not block aligned
	sparse[len(sparse)-1] = 1
	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"empty", nil},
		{"one-byte", []byte{0}},
		{"one-nonzero", []byte{'x'}},
		{"64MiB", big},
		{"sparse", sparse},
		{"trailing-hole", append(randomBytes(4096, 3), make([]byte, 1<<20)...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sum := sha256.Sum256(tc.data)
			created, err := f.WriteFile(ctx, "dir/"+tc.name, bytes.NewReader(tc.data), WriteOptions{Mkdirs: true, SHA256: sum[:]})
			if err != nil || !created {
				t.Fatalf("WriteFile = %v, %v", created, err)
			}
			got := readAll(t, f, "dir/"+tc.name)
			if !bytes.Equal(got, tc.data) {
				t.Fatalf("read back %d bytes, want %d identical", len(got), len(tc.data))
			}
			info, err := f.Stat("dir/" + tc.name)
			if err != nil || info.Type != "file" || info.Size != int64(len(tc.data)) || info.Mode.Perm() != 0o644 {
				t.Fatalf("Stat = %+v, %v", info, err)
			}
		})
	}
	// Holes stay holes: the sparse file occupies far less than its size.
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(l.work, "dir", "sparse"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Blocks*512 > 1<<20 {
		t.Errorf("sparse file allocates %d bytes for %d of data", st.Blocks*512, 5000+1)
	}
	if got := listTree(t, filepath.Join(l.work, "dir")); len(got) != 6 {
		t.Errorf("unexpected files (temp files left?): %v", got)
	}
}

func TestWriteFileReplaceCreatedExclusiveMode(t *testing.T) {
	l := newTestLease(t)
	f := openFS(t, l.config())
	ctx := context.Background()
	if created, err := f.WriteFile(ctx, "f", strings.NewReader("one"), WriteOptions{Mode: 0o4755}); err != nil || !created {
		t.Fatalf("first write: %v %v", created, err)
	}
	if info, _ := f.Stat("f"); info.Mode != 0o755 {
		t.Errorf("mode %v: setuid must be dropped", info.Mode)
	}
	if created, err := f.WriteFile(ctx, "f", strings.NewReader("two"), WriteOptions{}); err != nil || created {
		t.Fatalf("replace: %v %v", created, err)
	}
	if _, err := f.WriteFile(ctx, "f", strings.NewReader("three"), WriteOptions{Exclusive: true}); !errors.Is(err, ErrExists) {
		t.Fatalf("exclusive over existing: %v", err)
	}
	if got := string(readAll(t, f, "f")); got != "two" {
		t.Fatalf("content %q", got)
	}
	if _, err := f.WriteFile(ctx, "missing/f", strings.NewReader("x"), WriteOptions{}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing parent: %v", err)
	}
	if _, err := f.WriteFile(ctx, "f/g", strings.NewReader("x"), WriteOptions{}); !errors.Is(err, ErrNotDir) {
		t.Fatalf("parent is a file: %v", err)
	}
	if err := f.Mkdir("d"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteFile(ctx, "d", strings.NewReader("x"), WriteOptions{}); !errors.Is(err, ErrIsDir) {
		t.Fatalf("over a directory: %v", err)
	}
	if _, err := f.WriteFile(ctx, "", strings.NewReader("x"), WriteOptions{}); !errors.Is(err, ErrIsDir) {
		t.Fatalf("over the workdir: %v", err)
	}
	// A symlink at the target is replaced, not written through.
	if err := os.Symlink(filepath.Join(l.outside, "secret.txt"), filepath.Join(l.work, "link")); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteFile(ctx, "link", strings.NewReader("mine"), WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := string(readAll(t, f, "link")); got != "mine" {
		t.Fatalf("content %q", got)
	}
	assertOutsideUntouched(t, l)
}

func TestWriteFileOwnerAsRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give files to another uid (CI runs as root)")
	}
	l := newTestLease(t)
	cfg := l.config()
	cfg.UID, cfg.GID = 4242, 4343
	f := openFS(t, cfg)
	if _, err := f.WriteFile(context.Background(), "a/b/f", strings.NewReader("x"), WriteOptions{Mkdirs: true}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"a", "a/b", "a/b/f"} {
		var st syscall.Stat_t
		if err := syscall.Lstat(filepath.Join(l.work, p), &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid != 4242 || st.Gid != 4343 {
			t.Errorf("%s owned by %d:%d", p, st.Uid, st.Gid)
		}
	}
}

// failingReader yields n bytes and then fails, like a client that disconnects.
type failingReader struct {
	r io.Reader
	n int
}

func (r *failingReader) Read(p []byte) (int, error) {
	if r.n <= 0 {
		return 0, errors.New("connection reset")
	}
	p = p[:min(len(p), r.n)]
	n, err := r.r.Read(p)
	r.n -= n
	return n, err
}

func TestWriteFileFailuresLeaveNothing(t *testing.T) {
	l := newTestLease(t)
	cfg := l.config()
	cfg.QuotaBytes = 8 << 20
	f := openFS(t, cfg)
	ctx := context.Background()
	if _, err := f.WriteFile(ctx, "keep", strings.NewReader("old"), WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	data := randomBytes(4<<20, 4)
	whole := func() io.Reader { return bytes.NewReader(data) }
	wrong := sha256.Sum256([]byte("something else"))
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		r    func() io.Reader
		o    WriteOptions
		want error
	}{
		{"digest", ctx, whole, WriteOptions{SHA256: wrong[:]}, ErrDigest},
		{"bad-digest-length", ctx, whole, WriteOptions{SHA256: []byte{1, 2}}, ErrInvalid},
		{"quota", ctx, func() io.Reader { return io.MultiReader(whole(), whole(), whole()) }, WriteOptions{}, ErrQuota},
		{"reader-fails", ctx, func() io.Reader { return &failingReader{r: whole(), n: 3 << 20} }, WriteOptions{}, nil},
		{"cancelled", cancelled, whole, WriteOptions{}, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, target := range []string{"keep", "new"} {
				_, err := f.WriteFile(tc.ctx, target, tc.r(), tc.o)
				if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
					t.Fatalf("WriteFile(%s) = %v, want %v", target, err, tc.want)
				}
				if got := strings.Join(listTree(t, l.work), ","); got != "keep" {
					t.Fatalf("workdir after failure: %s", got)
				}
				if got := string(readAll(t, f, "keep")); got != "old" {
					t.Fatalf("old file changed: %q", got)
				}
			}
		})
	}
	// The quota still lets a write that fits through.
	if _, err := f.WriteFile(ctx, "fits", bytes.NewReader(data), WriteOptions{}); err != nil {
		t.Fatalf("write under quota: %v", err)
	}
}

func TestUsageCountsWritesAndReservations(t *testing.T) {
	l := newTestLease(t)
	f := openFS(t, l.config())
	ctx := context.Background()
	before, err := f.Usage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteFile(ctx, "f", bytes.NewReader(randomBytes(1<<20, 5)), WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	after, _ := f.Usage(ctx) // cached scan plus what the write kept
	if after-before < 1<<20 {
		t.Fatalf("usage %d → %d after a 1 MiB write", before, after)
	}
	// A fresh scan agrees with the accounting.
	g := openFS(t, l.config())
	scanned, _ := g.Usage(ctx)
	if scanned != after {
		t.Errorf("fresh scan %d, accounted %d", scanned, after)
	}
}

// Memory stays flat: a 64 MiB write allocates a small, fixed amount (the pooled buffers
// at most), never the size of the transfer.
func TestWriteFileMemoryIsFlat(t *testing.T) {
	l := newTestLease(t)
	f := openFS(t, l.config())
	block := randomBytes(1<<20, 12)
	h := sha256.New()
	io.Copy(h, &repeatReader{block: block, left: 64 << 20})
	sum := h.Sum(nil)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if _, err := f.WriteFile(context.Background(), "big", &repeatReader{block: block, left: 64 << 20}, WriteOptions{SHA256: sum}); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 4<<20 {
		t.Fatalf("a 64 MiB write allocated %d bytes", alloc)
	}
}

func TestUsageFollowsReplaceAndRemove(t *testing.T) {
	l := newTestLease(t)
	cfg := l.config()
	cfg.UsageTTL = time.Hour // only the accounting moves the figure
	f := openFS(t, cfg)
	ctx := context.Background()
	base, _ := f.Usage(ctx)
	for range 3 { // replacing the same file does not add up
		if _, err := f.WriteFile(ctx, "f", bytes.NewReader(randomBytes(1<<20, 13)), WriteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if u, _ := f.Usage(ctx); u-base < 1<<20 || u-base > 1<<20+8192 {
		t.Fatalf("usage grew by %d for one 1 MiB file", u-base)
	}
	if err := f.Remove("f", false); err != nil {
		t.Fatal(err)
	}
	if u, _ := f.Usage(ctx); u-base > 8192 {
		t.Fatalf("usage %d above base after removal", u-base)
	}
}
