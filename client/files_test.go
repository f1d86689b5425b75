package client

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// fakeUploads plays the resumable-upload protocol for one path, cutting the connection
// of the first cutAfter PATCHes once it holds cutAt more bytes.
type fakeUploads struct {
	t        *testing.T
	cutAt    int64
	cutAfter int
	mu       sync.Mutex
	partial  []byte
	done     []byte
	offsets  []int64 // Upload-Offset of every PATCH
	mode     string
}

func (f *fakeUploads) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch r.Method {
	case http.MethodHead:
		if f.partial == nil {
			writeProblem(w, 404, apitype.CodeNotFound, "")
			return
		}
		w.Header().Set(apitype.HeaderUploadOffset, strconv.Itoa(len(f.partial)))
	case http.MethodPatch:
		off, _ := strconv.ParseInt(r.Header.Get(apitype.HeaderUploadOffset), 10, 64)
		f.offsets = append(f.offsets, off)
		if off == 0 {
			f.partial = []byte{}
		}
		if off != int64(len(f.partial)) {
			writeProblem(w, 409, apitype.CodeConflict, "offset")
			return
		}
		if len(f.offsets) <= f.cutAfter {
			chunk := make([]byte, f.cutAt)
			n, _ := io.ReadFull(r.Body, chunk)
			f.partial = append(f.partial, chunk[:n]...)
			dropConnection(f.t, w)
			return
		}
		rest, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		f.partial = append(f.partial, rest...)
		sum := sha256.Sum256(f.partial)
		got, _ := apitype.ParseDigest(r.Header.Get(apitype.HeaderReprDigest))
		if r.Header.Get(apitype.HeaderUploadComplete) != "?1" || !bytes.Equal(got, sum[:]) {
			f.partial = nil
			writeProblem(w, 400, apitype.CodeDigestMismatch, "")
			return
		}
		f.done, f.partial, f.mode = f.partial, nil, r.Header.Get(apitype.HeaderFileMode)
		w.WriteHeader(http.StatusCreated)
	default:
		writeProblem(w, 405, "method_not_allowed", "")
	}
}

func TestUploadResumesAfterCut(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
	tests := []struct {
		name     string
		cutAfter int
		wantOffs []int64
	}{
		{"whole", 0, []int64{0}},
		{"one cut", 1, []int64{0, 300000}},
		{"two cuts", 2, []int64{0, 300000, 600000}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeUploads{t: t, cutAt: 300000, cutAfter: tt.cutAfter}
			c, _ := newTestClient(t, f)
			var last int64
			err := c.OpenLease("L1", "tok").Upload(context.Background(), "dir/big.bin", bytes.NewReader(data), int64(len(data)),
				UploadOptions{Mode: 0o640, MkdirAll: true, Progress: func(sent, total int64) { last = sent }})
			if err != nil {
				t.Fatal(err)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			if !bytes.Equal(f.done, data) || f.mode != "0640" || last != int64(len(data)) {
				t.Fatalf("server holds %d bytes (mode %q, progress %d)", len(f.done), f.mode, last)
			}
			if len(f.offsets) != len(tt.wantOffs) {
				t.Fatalf("PATCH offsets %v, want %v", f.offsets, tt.wantOffs)
			}
			for i := range f.offsets {
				if f.offsets[i] != tt.wantOffs[i] {
					t.Fatalf("PATCH offsets %v, want %v", f.offsets, tt.wantOffs)
				}
			}
		})
	}
}

func TestUploadRejectsShortSource(t *testing.T) {
	c, _ := newTestClient(t, http.NotFoundHandler())
	err := c.OpenLease("L1", "tok").Upload(context.Background(), "x", bytes.NewReader([]byte("abc")), 10, UploadOptions{})
	if !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("err = %v", err)
	}
}

// fakeFile serves one file with ETag, Range and Content-Digest; the first GET breaks
// after cutAt bytes.
func fakeFile(t *testing.T, data []byte, cutAt int, digest []byte) http.Handler {
	var mu sync.Mutex
	gets := 0
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		gets++
		first := gets == 1
		mu.Unlock()
		if r.URL.Query().Get("digest") == "sha-256" && r.Header.Get("Range") == "" {
			w.Header().Set(apitype.HeaderContentDigest, apitype.FormatDigest(digest))
		}
		w.Header().Set("ETag", `"v1"`)
		w.Header().Set(apitype.HeaderFileType, "file")
		if first && cutAt > 0 {
			w.Header().Set("Content-Length", strconv.Itoa(len(data)))
			w.WriteHeader(200)
			_, _ = w.Write(data[:cutAt])
			http.NewResponseController(w).Flush()
			dropConnection(t, w)
			return
		}
		http.ServeContent(w, r, "f", fixedTime, bytes.NewReader(data))
	})
}

func TestDownloadResumesAndVerifies(t *testing.T) {
	data := bytes.Repeat([]byte("download "), 100000)
	sum := sha256.Sum256(data)
	small := data[:10000] // one chunk: copied without the hashing goroutine
	smallSum := sha256.Sum256(small)
	for _, tc := range []struct {
		data []byte
		sum  []byte
		cut  int
	}{{data, sum[:], 0}, {data, sum[:], 1}, {data, sum[:], 450001}, {small, smallSum[:], 0}, {small, smallSum[:], 4001}} {
		c, _ := newTestClient(t, fakeFile(t, tc.data, tc.cut, tc.sum))
		var got bytes.Buffer
		n, err := c.OpenLease("L1", "tok").Download(context.Background(), "f", &got)
		if err != nil || n != int64(len(tc.data)) || !bytes.Equal(got.Bytes(), tc.data) {
			t.Fatalf("%d bytes cut at %d: n %d err %v", len(tc.data), tc.cut, n, err)
		}
	}
	bad := sha256.Sum256([]byte("something else"))
	c, _ := newTestClient(t, fakeFile(t, data, 0, bad[:]))
	if _, err := c.OpenLease("L1", "tok").ReadFile(context.Background(), "f"); !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("bad digest: err = %v", err)
	}
}

// failingWriter takes limit bytes, then fails.
type failingWriter struct{ limit, n int }

var errWriterFull = errors.New("writer full")

func (w *failingWriter) Write(p []byte) (int, error) {
	if w.n+len(p) > w.limit {
		k := w.limit - w.n
		w.n = w.limit
		return k, errWriterFull
	}
	w.n += len(p)
	return len(p), nil
}

func TestDownloadStopsAtAFailedWrite(t *testing.T) {
	data := bytes.Repeat([]byte("download "), 200000)
	sum := sha256.Sum256(data)
	c, _ := newTestClient(t, fakeFile(t, data, 0, sum[:]))
	w := &failingWriter{limit: 300001}
	n, err := c.OpenLease("L1", "tok").Download(context.Background(), "f", w)
	if !errors.Is(err, errWriterFull) || n != 300001 {
		t.Fatalf("n %d err %v, want 300001 bytes and the writer's error", n, err)
	}
}

func TestArchiveRoundTrip(t *testing.T) {
	src := t.TempDir()
	mustWrite(t, filepath.Join(src, "a.txt"), "alpha", 0o644)
	mustWrite(t, filepath.Join(src, "deep/er/ünïcode.txt"), "beta", 0o600)
	mustWrite(t, filepath.Join(src, "run.sh"), "#!/bin/sh\n", 0o755)
	if err := os.MkdirAll(filepath.Join(src, "empty"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("deep/er", filepath.Join(src, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "zero"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, enc := range []string{"", "gzip", "zstd"} {
		t.Run("enc="+enc, func(t *testing.T) {
			remote := t.TempDir() // the fake daemon's workdir
			c, _ := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				root, err := os.OpenRoot(remote)
				if err != nil {
					t.Error(err)
					return
				}
				defer root.Close()
				switch r.Method {
				case http.MethodPut:
					body, err := decodeBody(r)
					if err != nil {
						t.Error(err)
						return
					}
					if err := extractTar(root, body, nil, t.Logf); err != nil {
						t.Error(err)
					}
					w.WriteHeader(204)
				case http.MethodGet:
					if err := writeTree(w, remote, dirOptions{}, t.Logf); err != nil {
						t.Error(err)
					}
				}
			}))
			l := c.OpenLease("L1", "tok")
			var moved int64
			if err := l.UploadDir(context.Background(), src, "tree", WithCompression(enc), WithProgress(func(n int64) { moved = n })); err != nil {
				t.Fatal(err)
			}
			if moved != int64(len("alpha")+len("beta")+len("#!/bin/sh\n")) {
				t.Fatalf("progress said %d bytes", moved)
			}
			dst := filepath.Join(t.TempDir(), "out")
			if err := l.DownloadDir(context.Background(), "tree", dst); err != nil {
				t.Fatal(err)
			}
			assertSameTree(t, src, dst)
		})
	}
}
