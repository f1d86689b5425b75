package daemon_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// These tests kill -9 the built daemon in the middle of something, start it again on
// the same state dir and port, and check the side effects on the host, not only the
// answers: files in the workdir, processes in /proc, cgroups in /sys/fs/cgroup.

// faultUploadBytes is the size of the upload cut by a kill: a few hundred MiB by
// default (CI); SIDECAR_FAULT_UPLOAD_MIB=1024 gives the 1 GiB.
func faultUploadBytes(t *testing.T) int64 {
	if v := os.Getenv("SIDECAR_FAULT_UPLOAD_MIB"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 2 {
			t.Fatalf("SIDECAR_FAULT_UPLOAD_MIB=%q", v)
		}
		return int64(n) << 20
	}
	return 256 << 20
}

// acquireBin takes a lease on a binary daemon without a renewer (the daemon dies under it).
func acquireBin(t *testing.T, c *client.Client, session string) *client.Lease {
	t.Helper()
	l, err := c.Acquire(context.Background(), apitype.AcquireRequest{SessionID: session, TTLSeconds: 3600})
	if err != nil {
		t.Fatalf("acquire %s: %v", session, err)
	}
	l.StopRenewing()
	return l
}

func TestFaultKillDuringUpload(t *testing.T) {
	d := newBinDaemon(t)
	d.start()
	l := acquireBin(t, d.client, "upload")
	workdir := filepath.Join(d.workRoot(), l.ID(), "work")

	size := faultUploadBytes(t)
	want := sha256Of(t, &pattern{size: size, seed: 1})
	src := newGate(&pattern{size: size, seed: 1}, size/3)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- l.Upload(ctx, "data/big.bin", src, size, client.UploadOptions{MkdirAll: true, SHA256: want[:]})
	}()
	select {
	case <-src.reached:
	case err := <-done:
		t.Fatalf("upload ended before the kill: %v", err)
	case <-time.After(2 * time.Minute):
		t.Fatal("the upload never reached a third")
	}
	// What the daemon received is on its way to disk when it dies.
	upl := filepath.Join(d.workRoot(), l.ID(), "uploads")
	waitFor(t, "a partial upload on disk", 30*time.Second, func() bool { return dirSize(upl) > 0 })
	d.kill()

	if vis := visibleIn(t, workdir); slices.Contains(vis, "data/big.bin") || len(tempNames(vis)) > 0 {
		t.Fatalf("a partial upload is visible in the workdir after the kill: %v", vis)
	}
	d.start()
	if vis := visibleIn(t, workdir); slices.Contains(vis, "data/big.bin") || len(tempNames(vis)) > 0 {
		t.Fatalf("a partial upload is visible in the workdir after the restart: %v", vis)
	}
	status, hdr, body := d.raw(http.MethodHead, "/v1/leases/"+l.ID()+"/files/data/big.bin", l.Token(), nil, nil)
	off, _ := strconv.ParseInt(hdr.Get(apitype.HeaderUploadOffset), 10, 64)
	if status != http.StatusOK && status != http.StatusNotFound || off <= 0 || off > size/3 {
		t.Fatalf("after restart the daemon reports upload offset %q (status %d %s); want 1..%d", hdr.Get(apitype.HeaderUploadOffset), status, body, size/3)
	}
	t.Logf("killed at %d of %d bytes sent; the restarted daemon holds %d", size/3, size, off)

	close(src.open) // the client sees its connection gone, asks for the offset and resumes
	if err := <-done; err != nil {
		t.Fatalf("upload did not resume: %v", err)
	}
	f, err := os.Open(filepath.Join(workdir, "data", "big.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if got := sha256Of(t, f); got != want {
		t.Fatalf("resumed upload differs: sha-256 %x, want %x", got, want)
	}
	// The client's own download agrees with the disk.
	h := sha256.New()
	if _, err := l.Download(ctx, "data/big.bin", h); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(h.Sum(nil), want[:]) {
		t.Fatal("downloaded bytes differ from the upload")
	}
	if tmp := tempNames(visibleIn(t, workdir)); len(tmp) > 0 {
		t.Fatalf("temporaries left in the workdir: %v", tmp)
	}
	if n := dirSize(upl); n != 0 {
		t.Fatalf("the finished upload left %d bytes of parts", n)
	}
}

// dirSize is the bytes of regular files under dir (0 when it does not exist).
func dirSize(dir string) int64 {
	var n int64
	_ = filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return nil
	})
	return n
}

// treeTar is a tar of files files of size bytes each under dir/, and their contents.
func treeTar(t *testing.T, files, size int) ([]byte, map[string][32]byte) {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	sums := map[string][32]byte{}
	for i := range files {
		data, _ := io.ReadAll(&pattern{size: int64(size), seed: uint64(i)})
		name := fmt.Sprintf("f%04d.bin", i)
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(size), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		_, _ = tw.Write(data)
		sums[name] = sha256.Sum256(data)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), sums
}

func TestFaultKillDuringTarExtraction(t *testing.T) {
	d := newBinDaemon(t)
	d.start()
	l := acquireBin(t, d.client, "tar")
	workdir := filepath.Join(d.workRoot(), l.ID(), "work")
	archive, sums := treeTar(t, 128, 512<<10) // 64 MiB in 128 files

	src := newGate(bytes.NewReader(archive), int64(len(archive)/2))
	req, err := http.NewRequest(http.MethodPut, "https://"+d.addr+"/v1/leases/"+l.ID()+"/archive/tree", io.NopCloser(src))
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = int64(len(archive))
	req.Header.Set("Authorization", "Bearer "+l.Token())
	req.Header.Set("Content-Type", "application/x-tar")
	done := make(chan error, 1)
	go func() {
		resp, err := d.httpClient(2 * time.Minute).Do(req)
		if err == nil {
			resp.Body.Close()
			err = fmt.Errorf("the cut extraction answered %s", resp.Status)
		}
		done <- err
	}()
	<-src.reached
	// The extraction is under way: its staging directory holds files.
	waitFor(t, "the staging directory to fill", 60*time.Second, func() bool {
		for _, p := range tempNames(visibleIn(t, workdir)) {
			if strings.Count(p, "/") >= 1 {
				return true
			}
		}
		return false
	})
	d.kill()
	close(src.open)
	if err := <-done; err == nil {
		t.Fatal("the extraction cut by kill -9 reported success")
	}

	d.start()
	// The target directory itself may exist (the extraction makes it first, empty);
	// no extracted file may be visible outside a staging directory.
	vis := visibleIn(t, workdir)
	for _, p := range vis {
		if p != "tree" && !strings.Contains(p, ".sidecar-tmp-") {
			t.Fatalf("part of the cut extraction is visible after the restart: %s (of %v)", p, vis)
		}
	}
	if tmp := tempNames(vis); len(tmp) > 0 {
		var used int64
		if info, err := l.Get(context.Background()); err == nil && info.Usage != nil {
			used = info.Usage.DiskBytes
		}
		t.Errorf("BUG: the cut extraction's staging directory %s is still in the workdir after the restart, "+
			"with %d files in it, visible to the lease (disk usage reported: %d bytes): nothing sweeps .sidecar-tmp-* at start",
			tmp[0], len(vis)-2, used)
	}

	// The same archive, sent again, lands whole.
	status, _, body := d.raw(http.MethodPut, "/v1/leases/"+l.ID()+"/archive/tree", l.Token(), bytes.NewReader(archive), nil)
	if status != http.StatusOK {
		t.Fatalf("extract after restart: %d %s", status, body)
	}
	for name, sum := range sums {
		b, err := os.ReadFile(filepath.Join(workdir, "tree", name))
		if err != nil || sha256.Sum256(b) != sum {
			t.Fatalf("%s after re-extraction: %v", name, err)
		}
	}
}

// A plain PUT is written to a temporary beside its target and renamed: a kill in the
// middle leaves no target, and (once swept) no temporary.
func TestFaultKillDuringPut(t *testing.T) {
	d := newBinDaemon(t)
	d.start()
	l := acquireBin(t, d.client, "put")
	workdir := filepath.Join(d.workRoot(), l.ID(), "work")
	const size = 64 << 20
	src := newGate(&pattern{size: size, seed: 2}, size/2)
	req, err := http.NewRequest(http.MethodPut, "https://"+d.addr+"/v1/leases/"+l.ID()+"/files/put.bin", io.NopCloser(src))
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = size
	req.Header.Set("Authorization", "Bearer "+l.Token())
	done := make(chan error, 1)
	go func() {
		resp, err := d.httpClient(2 * time.Minute).Do(req)
		if err == nil {
			resp.Body.Close()
			err = fmt.Errorf("the cut PUT answered %s", resp.Status)
		}
		done <- err
	}()
	<-src.reached
	waitFor(t, "the PUT's temporary file", 60*time.Second, func() bool { return len(tempNames(visibleIn(t, workdir))) > 0 })
	d.kill()
	close(src.open)
	if err := <-done; err == nil {
		t.Fatal("a PUT cut by kill -9 reported success")
	}
	d.start()
	vis := visibleIn(t, workdir)
	if slices.Contains(vis, "put.bin") {
		t.Fatalf("a cut PUT's target is visible: %v", vis)
	}
	if tmp := tempNames(vis); len(tmp) > 0 {
		t.Errorf("BUG: the cut PUT's temporary %s (%d bytes) is still in the workdir after the restart: nothing sweeps .sidecar-tmp-* at start",
			tmp[0], dirSize(workdir))
	}
}

func TestFaultKillWithAttachedProcess(t *testing.T) {
	d := newBinDaemon(t)
	d.start()
	l := acquireBin(t, d.client, "process")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	marker := d.parent + "-sleeper"
	p, err := l.Start(ctx, apitype.StartRequest{ID: "sleeper", Argv: []string{"sh", "-c", "echo ready; while :; do sleep 1; done", marker}})
	if err != nil {
		t.Fatal(err)
	}
	ready := make([]byte, 6)
	if _, err := io.ReadFull(p.Stdout, ready); err != nil || string(ready) != "ready\n" {
		t.Fatalf("read %q: %v", ready, err)
	}
	if len(markedProcs(marker)) == 0 {
		t.Fatal("the marker process is not visible in /proc: the check below would prove nothing")
	}
	go func() { _, _ = io.Copy(io.Discard, p.Stdout) }()

	d.kill()
	// The lease's processes outlive the daemon until the next one starts.
	d.start()
	if left := markedProcs(marker); len(left) > 0 {
		t.Fatalf("processes of the killed daemon still run unsupervised after the restart: %v", left)
	}
	pr, err := l.Process(ctx, "sleeper")
	if err != nil {
		t.Fatal(err)
	}
	if pr.State != apitype.ProcessLost || pr.ExitCode != nil {
		t.Fatalf("after kill -9 and restart the process is %+v, want lost without an exit code", pr)
	}
	// The attached client reconnects and learns the same: lost, never exit 0.
	st, err := p.Wait(ctx)
	if err != nil || st.Status == apitype.StatusSuccess || !st.Lost || st.ExitCode == 0 {
		t.Fatalf("the attached client reports %+v (err %v), want a lost process", st, err)
	}
}

func TestFaultKillDuringRelease(t *testing.T) {
	d := newBinDaemon(t)
	d.start()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l := acquireBin(t, d.client, "release")
	keep := acquireBin(t, d.client, "bystander")
	if err := keep.WriteFile(ctx, "kept.txt", []byte("still here"), 0o644); err != nil {
		t.Fatal(err)
	}
	marker := d.parent + "-victim"
	if _, err := l.Start(ctx, apitype.StartRequest{ID: "victim", Argv: []string{"sh", "-c", "while :; do sleep 1; done", marker}}); err != nil {
		t.Fatal(err)
	}
	// Many files make the removal take long enough to be caught in the middle.
	if r, err := l.Exec(ctx, sh("mkdir many && cd many && seq 1 20000 | xargs touch")); err != nil || r.ExitCode != 0 {
		t.Fatalf("make files: %+v %v", r, err)
	}
	many := filepath.Join(d.workRoot(), l.ID(), "work", "many")
	released := make(chan error, 1)
	go func() { released <- l.Release(context.Background()) }()
	caught := true
	waitFor(t, "the release to start removing", 60*time.Second, func() bool {
		entries, err := os.ReadDir(many)
		if errors.Is(err, os.ErrNotExist) {
			caught = false // finished before we could cut it: the checks still hold
			return true
		}
		return len(entries) < 20000 || len(markedProcs(marker)) == 0
	})
	d.kill()
	<-released
	t.Logf("kill landed in the middle of the release: %v", caught)

	d.start()
	_, err := d.client.Get(ctx, l.ID())
	switch {
	case err == nil:
		// The state still knows it: releasing again must finish the job.
		if err := d.client.Release(ctx, l.ID()); err != nil {
			t.Fatalf("release after restart: %v", err)
		}
	case client.IsNotFound(err):
	default:
		t.Fatalf("get after restart: %v", err)
	}
	waitRetired(t, d.workRoot(), l.ID())
	for _, cg := range d.cgroups() {
		if strings.Contains(cg, l.ID()) {
			t.Fatalf("the released lease's cgroup is still there: %s", cg)
		}
	}
	if left := markedProcs(marker); len(left) > 0 {
		t.Fatalf("the released lease's processes survived: %v", left)
	}
	// The other lease is intact: state, token, files.
	got, err := keep.ReadFile(ctx, "kept.txt")
	if err != nil || string(got) != "still here" {
		t.Fatalf("the bystander lease after the restart: %q %v", got, err)
	}
}
