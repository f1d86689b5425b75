package daemon_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/daemon"
)

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func TestFileRoundTrips(t *testing.T) {
	d := startDaemon(t)
	l := d.acquire("files")
	ctx := context.Background()
	for _, size := range []int{0, 1, 4096, 3<<20 + 17} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			data := randomBytes(t, size)
			name := fmt.Sprintf("dir/f-%d.bin", size)
			status, _, body := d.raw("PUT", "/v1/leases/"+l.ID()+"/files/"+name+"?mkdirs=1", testToken, bytes.NewReader(data), nil)
			if status != http.StatusCreated {
				t.Fatalf("put: %d %s", status, body)
			}
			got := must(l.ReadFile(ctx, name))(t)
			if !bytes.Equal(got, data) {
				t.Fatalf("read back %d bytes, want %d identical", len(got), len(data))
			}
			var buf bytes.Buffer
			if n := must(l.Download(ctx, name, &buf))(t); n != int64(size) || !bytes.Equal(buf.Bytes(), data) {
				t.Fatalf("download %d bytes", n)
			}
		})
	}
	// Upload with digest and resume support, through the client.
	data := randomBytes(t, 5<<20)
	if err := l.Upload(ctx, "big.bin", bytes.NewReader(data), int64(len(data)), client.UploadOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := must(l.ReadFile(ctx, "big.bin"))(t); !bytes.Equal(got, data) {
		t.Fatal("uploaded file differs")
	}
	// Stat, list, move, remove.
	st := must(l.Stat(ctx, "big.bin"))(t)
	if st.Type != "file" || st.Size != int64(len(data)) {
		t.Fatalf("stat: %+v", st)
	}
	if err := l.Move(ctx, "big.bin", "dir/moved.bin"); err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, e := range must(l.List(ctx, "dir"))(t) {
		names[e.Name] = true
	}
	if !names["moved.bin"] || !names["f-1.bin"] {
		t.Fatalf("listing: %v", names)
	}
	if err := l.Remove(ctx, "dir", false); err == nil {
		t.Fatal("non-recursive remove of a non-empty dir succeeded")
	}
	if err := l.Remove(ctx, "dir", true); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Stat(ctx, "dir"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("stat after remove: %v", err)
	}
	// Files written through the API belong to the lease: a process in it can use them.
	if err := l.WriteFile(ctx, "script.sh", []byte("echo from-file"), 0o755); err != nil {
		t.Fatal(err)
	}
	if r := must(l.Exec(ctx, sh("./script.sh && echo again >> script.sh")))(t); r.Stdout != "from-file\n" || r.ExitCode != 0 {
		t.Fatalf("exec of an uploaded file: %+v", r)
	}
}

func TestFileDigestAndRange(t *testing.T) {
	d := startDaemon(t)
	l := d.acquire("digest")
	data := []byte("0123456789abcdef")
	sum := sha256.Sum256(data)
	good := "sha-256=:" + base64.StdEncoding.EncodeToString(sum[:]) + ":"
	bad := "sha-256=:" + base64.StdEncoding.EncodeToString(make([]byte, 32)) + ":"
	path := "/v1/leases/" + l.ID() + "/files/d.txt"

	status, hdr, body := d.raw("PUT", path, testToken, bytes.NewReader(data), map[string]string{"Content-Digest": bad})
	wantProblem(t, status, hdr, body, 400, apitype.CodeDigestMismatch)
	if _, err := l.Stat(context.Background(), "d.txt"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("a digest mismatch left a file: %v", err)
	}
	if status, _, body := d.raw("PUT", path, testToken, bytes.NewReader(data), map[string]string{"Content-Digest": good, "X-File-Mode": "0600"}); status != 201 {
		t.Fatalf("put with digest: %d %s", status, body)
	}
	status, hdr, body = d.raw("GET", path+"?digest=sha-256", testToken, nil, map[string]string{"Range": "bytes=4-7"})
	if status != http.StatusPartialContent || string(body) != "4567" || hdr.Get("Repr-Digest") != good {
		t.Fatalf("range: %d %q %v", status, body, hdr)
	}
	status, hdr, _ = d.raw("HEAD", path, testToken, nil, nil)
	if status != 200 || hdr.Get("X-File-Mode") != "0600" || hdr.Get("X-File-Size") != "16" || hdr.Get("ETag") == "" {
		t.Fatalf("head: %d %v", status, hdr)
	}
	status, _, _ = d.raw("GET", path, testToken, nil, map[string]string{"If-None-Match": hdr.Get("ETag")})
	if status != http.StatusNotModified {
		t.Fatalf("If-None-Match: %d", status)
	}
}

func TestFileConfinement(t *testing.T) {
	d := startDaemon(t)
	l := d.acquire("confine")
	ctx := context.Background()
	// A symlink that points out of the workdir, made by the lease itself.
	must(l.Exec(ctx, sh(`ln -s /etc etc-link; ln -s ../../.. up-link; mkfifo fifo`)))(t)
	base := "/v1/leases/" + l.ID() + "/files/"
	for name, path := range map[string]string{
		"dotdot":          "a/../../x",
		"encoded dotdot":  "%2e%2e/%2e%2e/etc/passwd",
		"symlink out":     "etc-link/passwd",
		"symlink up":      "up-link/etc/passwd",
		"encoded slashes": "..%2f..%2fetc%2fpasswd",
	} {
		t.Run(name, func(t *testing.T) {
			status, hdr, body := d.raw("GET", base+path, testToken, nil, nil)
			if status != 400 && status != 404 {
				t.Fatalf("GET %s: %d %s", path, status, body)
			}
			if status == 400 {
				wantProblem(t, status, hdr, body, 400, apitype.CodePathOutsideWorkdir)
			}
			status, _, body = d.raw("PUT", base+path, testToken, strings.NewReader("pwned"), nil)
			if status < 400 {
				t.Fatalf("PUT %s: %d %s", path, status, body)
			}
		})
	}
	if b, _ := os.ReadFile("/etc/passwd"); strings.Contains(string(b), "pwned") {
		t.Fatal("wrote outside the workdir")
	}
	// A FIFO is refused, never blocked on.
	status, hdr, body := d.raw("GET", base+"fifo", testToken, nil, nil)
	wantProblem(t, status, hdr, body, 400, apitype.CodeInvalidRequest)
}

func tarOf(t *testing.T, entries ...tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range entries {
		h := h
		body := []byte(nil)
		if h.Typeflag == tar.TypeReg {
			body = []byte("content of " + h.Name)
			h.Size = int64(len(body))
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		tw.Write(body)
	}
	tw.Close()
	return buf.Bytes()
}

func TestArchives(t *testing.T) {
	d := startDaemon(t)
	l := d.acquire("archive")
	ctx := context.Background()
	local := t.TempDir()
	for i := 0; i < 300; i++ {
		dir := filepath.Join(local, fmt.Sprintf("d%02d", i%20), "deeper", "still")
		os.MkdirAll(dir, 0o755)
		os.WriteFile(filepath.Join(dir, fmt.Sprintf("файл-%d.txt", i)), randomBytes(t, i*7), 0o644)
	}
	os.MkdirAll(filepath.Join(local, "empty"), 0o755)
	os.Symlink("d00/deeper", filepath.Join(local, "link"))
	if err := l.UploadDir(ctx, local, "tree"); err != nil {
		t.Fatal(err)
	}
	back := t.TempDir()
	if err := l.DownloadDir(ctx, "tree", back); err != nil {
		t.Fatal(err)
	}
	if diff := treeDiff(t, local, back); diff != "" {
		t.Fatalf("tree round trip differs: %s", diff)
	}

	hostile := map[string][]tar.Header{
		"escaping name":  {{Name: "../escape.txt", Typeflag: tar.TypeReg}},
		"absolute name":  {{Name: "/etc/sidecar-escape", Typeflag: tar.TypeReg}},
		"link out":       {{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/etc"}, {Name: "l/passwd", Typeflag: tar.TypeReg}},
		"hard link out":  {{Name: "h", Typeflag: tar.TypeLink, Linkname: "/etc/passwd"}},
		"device node":    {{Name: "dev", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}},
		"fifo":           {{Name: "fifo", Typeflag: tar.TypeFifo}},
		"good then evil": {{Name: "fine.txt", Typeflag: tar.TypeReg}, {Name: "../../evil.txt", Typeflag: tar.TypeReg}},
	}
	for name, entries := range hostile {
		t.Run(name, func(t *testing.T) {
			status, _, body := d.raw("PUT", "/v1/leases/"+l.ID()+"/archive/hostile", testToken, bytes.NewReader(tarOf(t, entries...)), nil)
			if status < 400 {
				t.Fatalf("hostile tar accepted: %d %s", status, body)
			}
			if _, err := l.Stat(ctx, "hostile"); !errors.Is(err, client.ErrNotFound) {
				entries, _ := l.List(ctx, "hostile")
				if len(entries) != 0 {
					t.Fatalf("a refused archive left %v behind", entries)
				}
			}
		})
	}
	for _, p := range []string{"/etc/sidecar-escape", filepath.Join(d.cfg.WorkRoot, "escape.txt")} {
		if _, err := os.Stat(p); err == nil {
			os.Remove(p)
			t.Fatalf("%s written by a hostile archive", p)
		}
	}
	// setuid bits are dropped.
	status, _, body := d.raw("PUT", "/v1/leases/"+l.ID()+"/archive/suid", testToken,
		bytes.NewReader(tarOf(t, tar.Header{Name: "s", Typeflag: tar.TypeReg, Mode: 0o4755})), nil)
	if status != 200 {
		t.Fatalf("suid tar: %d %s", status, body)
	}
	if st := must(l.Stat(ctx, "suid/s"))(t); st.Mode != "0755" {
		t.Fatalf("mode after extraction: %s", st.Mode)
	}
}

func treeDiff(t *testing.T, a, b string) string {
	t.Helper()
	walk := func(root string) map[string]string {
		m := map[string]string{}
		filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, p)
			switch {
			case fi.Mode()&os.ModeSymlink != 0:
				target, _ := os.Readlink(p)
				m[rel] = "link:" + target
			case fi.IsDir():
				m[rel] = "dir"
			default:
				data, _ := os.ReadFile(p)
				sum := sha256.Sum256(data)
				m[rel] = fmt.Sprintf("file:%x", sum[:8])
			}
			return nil
		})
		return m
	}
	ma, mb := walk(a), walk(b)
	for k, v := range ma {
		if mb[k] != v {
			return fmt.Sprintf("%s: %q vs %q", k, v, mb[k])
		}
	}
	if len(ma) != len(mb) {
		return fmt.Sprintf("%d entries vs %d", len(ma), len(mb))
	}
	return ""
}

func TestQuota(t *testing.T) {
	d := startDaemon(t, func(c *daemon.Config) {
		c.DefaultLimits.DiskBytes = 2 << 20
	})
	l := d.acquire("quota")
	ctx := context.Background()
	status, hdr, body := d.raw("PUT", "/v1/leases/"+l.ID()+"/files/big.bin", testToken, bytes.NewReader(randomBytes(t, 3<<20)), nil)
	wantProblem(t, status, hdr, body, http.StatusInsufficientStorage, apitype.CodeQuotaExceeded)
	if _, err := l.Stat(ctx, "big.bin"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("a write over quota left a file: %v", err)
	}
	if entries := must(l.List(ctx, ""))(t); len(entries) != 0 {
		t.Fatalf("a write over quota left %v", entries)
	}
	// Within the quota it works, and the usage shows it.
	// Random bytes: all-zero blocks are stored sparse and take no quota.
	if err := l.WriteFile(ctx, "small.bin", randomBytes(t, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	info := must(d.client.Get(ctx, l.ID()))(t)
	if info.Usage == nil || info.Usage.DiskBytes < 1<<20 {
		t.Fatalf("usage: %+v", info.Usage)
	}
}
