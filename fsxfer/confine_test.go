package fsxfer

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// The traversal corpus: every operation, every way out. Each must fail with its sentinel,
// write nothing outside and read nothing from outside.
func TestTraversalCorpus(t *testing.T) {
	l := newTestLease(t)
	cfg := l.config()
	cfg.Mount = "/workspace"
	f := openFS(t, cfg)
	writeTree(t, l.work, map[string]string{
		"etc":           "->/etc",
		"up":            "->../../outside",
		"deep/up":       "->../../../outside/dir",
		"abs-secret":    "->" + filepath.Join(l.outside, "secret.txt"),
		"inside":        "->deep",
		"ok/file.txt":   "ok",
		"ok/empty-dir/": "",
	})
	ctx := context.Background()
	long := strings.Repeat("x/", 2049)
	for _, tc := range []struct {
		path string
		want error
	}{
		{"../outside/secret.txt", ErrOutside},
		{"ok/../../outside/secret.txt", ErrOutside},
		{"..", ErrOutside},
		{"/etc/passwd", ErrOutside},
		{"/workspace/../outside/secret.txt", ErrOutside},
		{"/workspace/ok/../../outside/secret.txt", ErrOutside},
		{"/workspace/etc/passwd", ErrOutside},
		{"/workspace/up/secret.txt", ErrOutside},
		{"/workspaces/ok/file.txt", ErrOutside},
		{"/workspace\x00/ok", ErrOutside},
		{"//workspace/ok", ErrOutside},
		{"/" + l.work + "/ok", ErrOutside},
		{l.work + "/ok", ErrOutside},
		{"ok/\x00secret", ErrOutside},
		{"etc/passwd", ErrOutside},
		{"up/secret.txt", ErrOutside},
		{"deep/up/x", ErrOutside},
		{"inside/up/x", ErrOutside},
		{long, ErrNameTooLong},
		{strings.Repeat("y", 300), ErrNameTooLong},
	} {
		ops := map[string]func() error{
			"Stat":   func() error { _, err := f.Stat(tc.path); return err },
			"List":   func() error { _, err := f.List(tc.path); return err },
			"Open":   func() error { _, err := f.Open(tc.path); return err },
			"Mkdir":  func() error { return f.Mkdir(tc.path + "/new") },
			"Remove": func() error { return f.Remove(tc.path, true) },
			"Write": func() error {
				_, err := f.WriteFile(ctx, tc.path+"/new", strings.NewReader("x"), WriteOptions{Mkdirs: true})
				return err
			},
			"MoveFrom": func() error { return f.Move(tc.path, "ok/moved") },
			"MoveTo":   func() error { return f.Move("ok/file.txt", tc.path+"/moved") },
			"Upload": func() error {
				_, err := f.AppendUpload(ctx, tc.path+"/new", 0, strings.NewReader("x"), true, WriteOptions{Mkdirs: true})
				return err
			},
			"ExtractTar": func() error {
				_, err := f.ExtractTar(ctx, tc.path, tarOf(t, tarEntry{name: "x", body: "x"}), "")
				return err
			},
			"WriteTar": func() error { return f.WriteTar(ctx, tc.path, io.Discard) },
		}
		for op, fn := range ops {
			if err := fn(); !errors.Is(err, tc.want) {
				t.Errorf("%s(%.50q) = %v, want %v", op, tc.path, err, tc.want)
			}
		}
	}
	// Symlinks as the last element are described, removed or moved, never followed.
	if info, err := f.Stat("etc"); err != nil || info.Type != "symlink" || info.Target != "/etc" {
		t.Errorf("Stat(etc) = %+v, %v", info, err)
	}
	if _, err := f.Open("abs-secret"); !errors.Is(err, ErrOutside) {
		t.Errorf("Open(abs-secret) = %v, want ErrOutside", err)
	}
	if _, err := f.List("up"); !errors.Is(err, ErrOutside) {
		t.Errorf("List(up) = %v, want ErrOutside", err)
	}
	if err := f.Remove("up", false); err != nil {
		t.Errorf("Remove(up) = %v", err)
	}
	if err := f.Remove("", true); !errors.Is(err, ErrInvalid) {
		t.Errorf("Remove(workdir) = %v, want ErrInvalid", err)
	}
	assertOutsideUntouched(t, l)
	if _, err := os.Stat("/etc/passwd/new"); err == nil {
		t.Fatal("wrote under /etc")
	}
}

func TestFIFOAndDevicesNeverBlock(t *testing.T) {
	l := newTestLease(t)
	f := openFS(t, l.config())
	if err := syscall.Mkfifo(filepath.Join(l.work, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/zero", filepath.Join(l.work, "zero")); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := f.Open("fifo")
		if !errors.Is(err, ErrNotRegular) {
			done <- err
			return
		}
		_, err = f.List("fifo")
		if !errors.Is(err, ErrNotDir) {
			done <- err
			return
		}
		var buf strings.Builder
		if err := f.WriteTar(context.Background(), "", &buf); err != nil {
			done <- err
			return
		}
		_, err = f.Open("zero") // absolute symlink: never reaches the device
		if !errors.Is(err, ErrOutside) {
			done <- err
			return
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second): // a deadline for a hang, not a timing assertion
		t.Fatal("an operation blocked on a FIFO")
	}
	info, err := f.Stat("fifo")
	if err != nil || info.Type != "other" {
		t.Fatalf("Stat(fifo) = %+v, %v", info, err)
	}
}

func TestHardLinkToOutside(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the lease uid must differ from the owner of the outside file (CI runs as root)")
	}
	l := newTestLease(t)
	cfg := l.config()
	cfg.UID, cfg.GID = 4242, 4242 // the lease uid; the outside file belongs to root
	f := openFS(t, cfg)
	if err := os.Link(filepath.Join(l.outside, "secret.txt"), filepath.Join(l.work, "hl")); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Open("hl"); !errors.Is(err, ErrForeignLink) || !errors.Is(err, ErrNotRegular) {
		t.Fatalf("Open(hard link) = %v, want ErrForeignLink", err)
	}
	if _, err := f.WriteFile(context.Background(), "hl", strings.NewReader("pwned"), WriteOptions{}); !errors.Is(err, ErrForeignLink) {
		t.Fatalf("WriteFile(hard link) = %v, want ErrForeignLink", err)
	}
	var sb strings.Builder
	if err := f.WriteTar(context.Background(), "", &sb); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(sb.String(), "secret") {
		t.Fatal("archive carries the outside file's content")
	}
	assertOutsideUntouched(t, l)
	// The lease's own hard links are fine.
	writeTree(t, l.work, map[string]string{"mine": "mine"})
	os.Chown(filepath.Join(l.work, "mine"), 4242, 4242)
	if err := os.Link(filepath.Join(l.work, "mine"), filepath.Join(l.work, "mine2")); err != nil {
		t.Fatal(err)
	}
	if got := string(readAll(t, f, "mine2")); got != "mine" {
		t.Fatalf("own hard link: %q", got)
	}
}

// A lease process flips a path between a directory and a symlink pointing out while
// files are written through it: nothing may ever land outside, nor be read from there.
func TestSymlinkSwapRace(t *testing.T) {
	l := newTestLease(t)
	f := openFS(t, l.config())
	ctx := context.Background()
	swap := filepath.Join(l.work, "swap")
	writeTree(t, l.work, map[string]string{"real/secret.txt": "inside"})
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tmp := filepath.Join(l.work, "swap.tmp")
		for i := 0; !stop.Load(); i++ {
			target := "real"
			if i%2 == 1 {
				target = "../../outside"
			}
			os.Remove(tmp)
			if os.Symlink(target, tmp) == nil {
				os.Rename(tmp, swap)
			}
		}
	}()
	var wrote, refused int
	for i := range 300 {
		_, err := f.WriteFile(ctx, "swap/new.txt", strings.NewReader("x"), WriteOptions{})
		if err == nil {
			wrote++
		} else if errors.Is(err, ErrOutside) {
			refused++
		}
		if h, err := f.Open("swap/secret.txt"); err == nil {
			b, _ := io.ReadAll(h)
			h.Close()
			if string(b) != "inside" {
				t.Fatalf("read %q from outside at iteration %d", b, i)
			}
		}
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("wrote %d, refused %d", wrote, refused)
	if _, err := os.Lstat(filepath.Join(l.outside, "new.txt")); err == nil {
		t.Fatal("a write landed outside the workdir")
	}
	assertOutsideUntouched(t, l)
}

func TestStatListMkdirMoveRemove(t *testing.T) {
	l := newTestLease(t)
	f := openFS(t, l.config())
	writeTree(t, l.work, map[string]string{"b.txt": "bb", "a/x": "x", "link": "->a", "c/": ""})
	infos, err := f.List("")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, i := range infos {
		got = append(got, i.Name+":"+i.Type+":"+i.Target)
	}
	if strings.Join(got, ",") != "a:dir:,b.txt:file:,c:dir:,link:symlink:a" {
		t.Fatalf("List = %v", got)
	}
	if infos, err := f.List("link"); err != nil || len(infos) != 1 || infos[0].Name != "x" {
		t.Fatalf("List through an inside symlink = %v, %v", infos, err)
	}
	if _, err := f.List("b.txt"); !errors.Is(err, ErrNotDir) {
		t.Fatalf("List(file) = %v", err)
	}
	if _, err := f.Stat("nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Stat(nope) = %v", err)
	}
	if info, err := f.Stat(""); err != nil || info.Type != "dir" {
		t.Fatalf("Stat(workdir) = %+v, %v", info, err)
	}
	if _, err := f.Open("a"); !errors.Is(err, ErrIsDir) {
		t.Fatalf("Open(dir) = %v", err)
	}

	if err := f.Mkdir("m/n/o"); err != nil {
		t.Fatal(err)
	}
	if err := f.Mkdir("m/n/o"); err != nil {
		t.Fatalf("Mkdir existing: %v", err)
	}
	if err := f.Mkdir("b.txt/sub"); !errors.Is(err, ErrNotDir) {
		t.Fatalf("Mkdir under a file: %v", err)
	}
	if info, _ := f.Stat("m/n"); info.Mode.Perm() != 0o755 {
		t.Fatalf("mkdir mode %v", info.Mode)
	}

	if err := f.Move("b.txt", "m/n/o/b.txt"); err != nil {
		t.Fatal(err)
	}
	if err := f.Move("a", "missing/a"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Move to missing parent: %v", err)
	}
	if err := f.Move("m", "m/n/inside"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Move into itself: %v", err)
	}
	if err := f.Move("", "x"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Move(workdir): %v", err)
	}

	if err := f.Remove("m", false); !errors.Is(err, ErrNotEmpty) {
		t.Fatalf("Remove non-empty: %v", err)
	}
	if err := f.Remove("c", false); err != nil {
		t.Fatalf("Remove empty dir: %v", err)
	}
	if err := f.Remove("link", true); err != nil {
		t.Fatalf("Remove link: %v", err)
	}
	if err := f.Remove("m", true); err != nil {
		t.Fatal(err)
	}
	if err := f.Remove("m", true); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Remove twice: %v", err)
	}
	if got := strings.Join(listTree(t, l.work), ","); got != "a/,a/x" {
		t.Fatalf("left: %s", got)
	}
}

func TestRemoveRefusesBindMount(t *testing.T) {
	l := newTestLease(t)
	f := openFS(t, l.config())
	writeTree(t, l.work, map[string]string{"tree/a": "a", "tree/mnt/": ""})
	bindMount(t, l.outside, filepath.Join(l.work, "tree", "mnt"))
	if err := f.Remove("tree", true); !errors.Is(err, ErrMountPoint) {
		t.Fatalf("Remove = %v, want ErrMountPoint", err)
	}
	if err := f.Remove("tree/mnt", true); !errors.Is(err, ErrMountPoint) {
		t.Fatalf("Remove(mount point) = %v, want ErrMountPoint", err)
	}
	assertOutsideUntouched(t, l)
	if got := strings.Join(listTree(t, filepath.Join(l.work, "tree")), ","); !strings.HasPrefix(got, "a,mnt/") {
		t.Fatalf("tree after refusal: %s", got)
	}
	// WriteTar stores the mount point as an empty directory and never enters it.
	var sb strings.Builder
	if err := f.WriteTar(context.Background(), "", &sb); err != nil {
		t.Fatal(err)
	}
	if names := tarNames(t, sb.String()); strings.Join(names, ",") != "tree/,tree/a,tree/mnt/" {
		t.Fatalf("archive across a mount: %v", names)
	}
}

// Config.Mount names the workdir absolutely: "/workspace" is the workdir, "/workspace/x"
// its x, for every operation; without it, or for any other absolute path, ErrOutside.
func TestMountNamesTheWorkdir(t *testing.T) {
	l := newTestLease(t)
	cfg := l.config()
	cfg.Mount = "/workspace"
	f := openFS(t, cfg)
	writeTree(t, l.work, map[string]string{"ok/file.txt": "ok\n"})
	ctx := context.Background()
	if _, err := f.WriteFile(ctx, "/workspace/new.txt", strings.NewReader("new\n"), WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(l.work, "new.txt")); err != nil || string(b) != "new\n" {
		t.Errorf("new.txt: %q, %v", b, err)
	}
	for _, p := range []string{"/workspace", "/workspace/", "/workspace/.", "/workspace//."} {
		if entries, err := f.List(p); err != nil || len(entries) != 2 {
			t.Errorf("List(%q) = %v, %v; want the workdir's 2 entries", p, entries, err)
		}
	}
	if info, err := f.Stat("/workspace/ok/file.txt"); err != nil || info.Size != 3 {
		t.Errorf("Stat = %+v, %v", info, err)
	}
	if err := f.Move("/workspace/ok/file.txt", "/workspace/moved.txt"); err != nil {
		t.Fatal(err)
	}
	res, err := f.Find(ctx, "/workspace", FindOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, e := range res.Entries {
		found = append(found, e.Path)
	}
	if want := "moved.txt new.txt ok"; strings.Join(found, " ") != want {
		t.Errorf("Find(/workspace) = %q, want %q (relative, as for a relative start)", found, want)
	}
	g, err := f.Grep(ctx, "/workspace", GrepOptions{Pattern: "ok"})
	g.Release()
	if err != nil || len(g.Matches) != 1 || g.Matches[0].Path != "moved.txt" {
		t.Errorf("Grep(/workspace) = %+v, %v", g, err)
	}

	plain := openFS(t, l.config())
	if _, err := plain.Stat("/workspace/new.txt"); !errors.Is(err, ErrOutside) {
		t.Errorf("without Mount: Stat(/workspace/new.txt) = %v, want ErrOutside", err)
	}
	for _, m := range []string{"workspace", "/", "/a/../b"} {
		cfg.Mount = m
		if _, err := Open(cfg); !errors.Is(err, ErrInvalid) {
			t.Errorf("Open with Mount %q = %v, want ErrInvalid", m, err)
		}
	}
}
