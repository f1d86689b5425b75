package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// searchTree makes 10,000 files in 200 directories inside the lease, by a lease process:
// half .go, half .txt; "needle" on one line of every third file and twice in every
// ninth.
const searchTree = `set -e
d=0
while [ $d -lt 200 ]; do
  mkdir -p dir$d
  f=0
  while [ $f -lt 50 ]; do
    ext=txt; [ $((f % 2)) -eq 0 ] && ext=go
    {
      printf 'package p%d\n\nfunc F%d_%d() int {\n' $d $d $f
      [ $((f % 3)) -eq 0 ] && printf '\treturn 1 // needle %d\n' $f
      [ $((f % 9)) -eq 0 ] && printf 'needle again\n'
      printf '}\n'
    } > dir$d/f$f.$ext
    f=$((f + 1))
  done
  d=$((d + 1))
done`

func makeSearchTree(t testing.TB, l *client.Lease) {
	t.Helper()
	res, err := l.Exec(context.Background(), apitype.ExecRequest{Argv: []string{"/bin/sh", "-c", searchTree}, TimeoutSeconds: 300})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("make tree: %+v %v", res, err)
	}
}

// execLines runs a shell command in the lease and returns its sorted output lines with
// any "./" prefix removed.
func execLines(t testing.TB, l *client.Lease, script string) []string {
	t.Helper()
	res, err := l.Exec(context.Background(), apitype.ExecRequest{Argv: []string{"/bin/sh", "-c", script}, TimeoutSeconds: 120})
	if err != nil || res.ExitCode > 1 || res.StdoutTruncated {
		t.Fatalf("%s: %+v %v", script, res, err)
	}
	var out []string
	for _, ln := range strings.Split(strings.TrimRight(res.Stdout, "\n"), "\n") {
		if ln != "" {
			out = append(out, strings.TrimPrefix(ln, "./"))
		}
	}
	slices.Sort(out)
	return out
}

func findPaths(r apitype.FindResult) []string {
	out := []string{}
	for _, e := range r.Entries {
		out = append(out, e.Path)
	}
	return out
}

func grepLines(r apitype.GrepResult) []string {
	out := []string{}
	for _, m := range r.Matches {
		out = append(out, fmt.Sprintf("%s:%d:%s", m.Path, m.Line, m.Text))
	}
	return out
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

func TestFindAndGrepAgreeWithFindAndGrepInTheLease(t *testing.T) {
	d := startDaemon(t)
	l := d.acquire("search")
	ctx := context.Background()
	makeSearchTree(t, l)

	// find by glob, and everything.
	for _, tc := range []struct {
		name  string
		shell string
		opts  client.FindOptions
	}{
		{"glob", `find . -name '*.go'`, client.FindOptions{TreeOptions: client.TreeOptions{Globs: []string{"*.go"}}}},
		{"path glob", `find . -path './dir1*/f1*.txt'`, client.FindOptions{TreeOptions: client.TreeOptions{Globs: []string{"dir1*/f1*.txt"}}}},
		{"everything", `find . -mindepth 1`, client.FindOptions{}},
		{"dirs", `find . -mindepth 1 -type d`, client.FindOptions{Type: "dir"}},
	} {
		t.Run("find "+tc.name, func(t *testing.T) {
			want := execLines(t, l, tc.shell)
			tc.opts.Limit = 100_000
			res := must(l.Find(ctx, "", tc.opts))(t)
			got := findPaths(res)
			if res.Truncated || !slices.Equal(sorted(got), want) {
				t.Fatalf("got %d entries (truncated %v), find has %d; first differences: %q", len(got), res.Truncated, len(want), firstDiff(sorted(got), want))
			}
			// Past a limit: the first entries of the same walk, and truncated.
			res = must(l.Find(ctx, "", client.FindOptions{TreeOptions: tc.opts.TreeOptions, Type: tc.opts.Type, Limit: 100}))(t)
			if !res.Truncated || res.Reason != "limit" || !slices.Equal(findPaths(res), got[:100]) || res.Next != got[99] {
				t.Fatalf("limit 100: truncated %v reason %q next %q, %d entries", res.Truncated, res.Reason, res.Next, len(res.Entries))
			}
			next := must(l.Find(ctx, "", client.FindOptions{TreeOptions: tc.opts.TreeOptions, Type: tc.opts.Type, Limit: 100, After: res.Next}))(t)
			if !slices.Equal(findPaths(next), got[100:200]) {
				t.Fatal("the next page does not continue the first")
			}
		})
	}
	if n := len(execLines(t, l, `find . -type f`)); n != 10_000 {
		t.Fatalf("tree has %d files", n)
	}

	// grep for a string and for a regexp.
	for _, tc := range []struct {
		name, shell, pattern string
		opts                 client.GrepOptions
	}{
		{"fixed", `grep -rn -F needle .`, "needle", client.GrepOptions{Fixed: true}},
		{"regexp", `grep -rn -E '^func F1[0-9]_[0-9]*\(' .`, `^func F1[0-9]_[0-9]*\(`, client.GrepOptions{}},
		{"ignore case", `grep -rni -F NEEDLE --include='*.go' .`, "NEEDLE", client.GrepOptions{Fixed: true, IgnoreCase: true, TreeOptions: client.TreeOptions{Globs: []string{"*.go"}}}},
	} {
		t.Run("grep "+tc.name, func(t *testing.T) {
			want := execLines(t, l, tc.shell)
			tc.opts.MaxMatches = 100_000
			res := must(l.Grep(ctx, "", tc.pattern, tc.opts))(t)
			got := grepLines(res)
			if res.Truncated || !slices.Equal(sorted(got), want) || len(want) == 0 {
				t.Fatalf("got %d lines (truncated %v), grep has %d; first differences: %q", len(got), res.Truncated, len(want), firstDiff(sorted(got), want))
			}
			tc.opts.MaxMatches = 50
			res = must(l.Grep(ctx, "", tc.pattern, tc.opts))(t)
			if !res.Truncated || res.Reason != "matches" || !slices.Equal(grepLines(res), got[:50]) {
				t.Fatalf("max 50: truncated %v reason %q, %d lines", res.Truncated, res.Reason, len(res.Matches))
			}
		})
	}
}

func firstDiff(a, b []string) []string {
	var out []string
	for _, s := range a {
		if _, ok := slices.BinarySearch(b, s); !ok {
			out = append(out, "+"+s)
		}
	}
	for _, s := range b {
		if _, ok := slices.BinarySearch(a, s); !ok {
			out = append(out, "-"+s)
		}
	}
	return out[:min(len(out), 5)]
}

// What is not the lease's own is never read, listed through or followed: symlinks to
// /etc and to another lease, FIFOs, bind mounts, files of another uid, and a 1 GiB
// sparse file stays under the size cap.
func TestSearchConfinement(t *testing.T) {
	needRoot(t)
	d := startDaemon(t)
	l := d.acquire("search-confine")
	other := d.acquire("search-other")
	ctx := context.Background()
	must(other.Exec(ctx, sh(`mkdir -p theirs && echo 'needle of the other lease' > theirs/secret`)))(t)
	work := filepath.Join(d.cfg.WorkRoot, l.ID(), "work")
	otherWork := filepath.Join(d.cfg.WorkRoot, other.ID(), "work")
	must(l.Exec(ctx, sh(fmt.Sprintf(`echo 'needle mine' > mine.txt && ln -s /etc etc && ln -s %s other && mkfifo fifo && mkdir mnt && truncate -s 1G big && echo needle >> big`, otherWork))))(t)
	// A bind mount of a host directory and a file of root, both holding the needle.
	host := t.TempDir()
	if err := os.WriteFile(filepath.Join(host, "hostfile"), []byte("needle on the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(host, filepath.Join(work, "mnt"), "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := unix.Unmount(filepath.Join(work, "mnt"), unix.MNT_DETACH); err != nil {
			t.Errorf("unmount: %v", err)
		}
	}()
	if err := os.WriteFile(filepath.Join(work, "roots"), []byte("needle of root\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	res := must(l.Find(ctx, "", client.FindOptions{TreeOptions: client.TreeOptions{Hidden: true}}))(t)
	// Names are listed (root's file too, as ls would show it); nothing is entered or read.
	if got, want := findPaths(res), []string{"big", "etc", "fifo", "mine.txt", "mnt", "other", "roots"}; !slices.Equal(got, want) {
		t.Fatalf("find: %q, want %q", got, want)
	}
	g := must(l.Grep(ctx, "", "needle|root:", client.GrepOptions{TreeOptions: client.TreeOptions{Hidden: true}}))(t)
	if got := grepLines(g); !slices.Equal(got, []string{"mine.txt:1:needle mine"}) || g.SkippedLarge != 1 {
		t.Fatalf("grep read what is not the lease's: %q (skipped large %d)", got, g.SkippedLarge)
	}
	// Named directly: refused, never followed.
	for _, p := range []string{"etc", "other", "other/theirs", "mnt", "etc/passwd", "fifo", "roots"} {
		_, err := l.Grep(ctx, p, "needle|root:", client.GrepOptions{})
		if err == nil {
			t.Errorf("grep %s: no error", p)
		}
		if _, err := l.Find(ctx, p, client.FindOptions{}); err == nil {
			t.Errorf("find %s: no error", p)
		}
	}
	// The size cap: a 1 GiB file is skipped unread, and the cap has a ceiling.
	g = must(l.Grep(ctx, "big", "needle", client.GrepOptions{Fixed: true}))(t)
	if len(g.Matches) != 0 || g.SkippedLarge != 1 {
		t.Fatalf("grep over the size cap: %+v", g)
	}
	if _, err := l.Grep(ctx, "", "needle", client.GrepOptions{MaxFileBytes: 2 << 30}); !errors.Is(err, client.ErrInvalidRequest) {
		t.Fatalf("cap over the ceiling: %v", err)
	}
	// Stat describes the link, never its target; a missing path is not an error.
	st := must(l.FileStat(ctx, "etc"))(t)
	if !st.Exists || st.Type != "symlink" || st.Target != "/etc" {
		t.Fatalf("stat of a symlink: %+v", st)
	}
	if ok := must(l.Exists(ctx, "nothing/here"))(t); ok {
		t.Fatal("a missing path exists")
	}
	if _, err := l.Watch(ctx, "mnt", client.WatchOptions{}); err == nil {
		t.Fatal("watch across a mount")
	}
}

func TestStatReadLinesReplaceAndConditionalWrites(t *testing.T) {
	d := startDaemon(t)
	l := d.acquire("edit")
	ctx := context.Background()
	must(l.Exec(ctx, sh(`printf 'one\ntwo\nthree\nfour\n' > f.txt && chmod 600 f.txt`)))(t)
	st := must(l.FileStat(ctx, "f.txt"))(t)
	if !st.Exists || st.Type != "file" || st.Size != 19 || st.Mode != "0600" || st.ETag == "" || st.ModTime.IsZero() {
		t.Fatalf("stat: %+v", st)
	}
	lines := must(l.ReadLines(ctx, "f.txt", 1, 2))(t)
	if string(lines.Data) != "two\nthree\n" || lines.Count != 2 || !lines.More || lines.ETag != st.ETag {
		t.Fatalf("lines 1+2: %+v", lines)
	}
	read := func() string { return string(must(l.ReadFile(ctx, "f.txt"))(t)) }

	_, err := l.Replace(ctx, "f.txt", "five", "5", client.ReplaceOptions{})
	if !errors.Is(err, client.ErrOldTextNotFound) {
		t.Fatalf("absent: %v", err)
	}
	_, err = l.Replace(ctx, "f.txt", "o", "0", client.ReplaceOptions{})
	if !errors.Is(err, client.ErrOldTextNotUnique) {
		t.Fatalf("ambiguous: %v", err)
	}
	res := must(l.Replace(ctx, "f.txt", "two", "2", client.ReplaceOptions{IfMatch: st.ETag}))(t)
	if res.Replacements != 1 || read() != "one\n2\nthree\nfour\n" || res.ETag == st.ETag {
		t.Fatalf("unique: %+v %q", res, read())
	}
	// The old ETag is stale now: refused, nothing changes.
	_, err = l.Replace(ctx, "f.txt", "one", "1", client.ReplaceOptions{IfMatch: st.ETag})
	var apiErr *client.APIError
	if !errors.Is(err, client.ErrPreconditionFailed) || !errors.As(err, &apiErr) || apiErr.Status != http.StatusPreconditionFailed {
		t.Fatalf("stale If-Match: %v", err)
	}
	if _, err := l.WriteFileIf(ctx, "f.txt", []byte("x"), 0, client.WriteCondition{IfMatch: st.ETag}); !errors.Is(err, client.ErrPreconditionFailed) {
		t.Fatalf("PUT with a stale If-Match: %v", err)
	}
	if _, err := l.WriteFileIf(ctx, "f.txt", []byte("x"), 0, client.WriteCondition{CreateOnly: true}); !errors.Is(err, client.ErrPreconditionFailed) {
		t.Fatalf("PUT If-None-Match * over a file: %v", err)
	}
	if read() != "one\n2\nthree\nfour\n" {
		t.Fatalf("refused writes changed the file: %q", read())
	}
	if st2 := must(l.FileStat(ctx, "f.txt"))(t); st2.Mode != "0600" || st2.ETag != res.ETag {
		t.Fatalf("after replace: %+v (etag %s)", st2, res.ETag)
	}
	all := must(l.Replace(ctx, "f.txt", "o", "0", client.ReplaceOptions{All: true}))(t)
	if all.Replacements != 2 || read() != "0ne\n2\nthree\nf0ur\n" {
		t.Fatalf("all: %+v %q", all, read())
	}
	tag := must(l.WriteFileIf(ctx, "g.txt", []byte("new"), 0, client.WriteCondition{CreateOnly: true}))(t)
	if tag == "" {
		t.Fatal("no ETag on a created file")
	}
	if _, err := l.WriteFileIf(ctx, "g.txt", []byte("newer"), 0, client.WriteCondition{IfMatch: tag}); err != nil {
		t.Fatalf("PUT with a fresh If-Match: %v", err)
	}
	// The lease changes the file behind the agent's back: the agent's ETag goes stale.
	tag = must(l.FileStat(ctx, "g.txt"))(t).ETag
	must(l.Exec(ctx, sh(`echo more >> g.txt`)))(t)
	if _, err := l.Replace(ctx, "g.txt", "newer", "x", client.ReplaceOptions{IfMatch: tag}); !errors.Is(err, client.ErrPreconditionFailed) {
		t.Fatalf("replace after a lease write: %v", err)
	}
}

func watchNext(t *testing.T, w *client.Watcher) apitype.WatchEvent {
	t.Helper()
	e, err := w.Next()
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestWatch(t *testing.T) {
	d := startDaemon(t)
	l := d.acquire("watch")
	ctx := context.Background()
	must(l.Exec(ctx, sh(`mkdir -p sub`)))(t)
	w := must(l.Watch(ctx, "", client.WatchOptions{Recursive: true}))(t)
	defer w.Close()
	must(l.Exec(ctx, sh(`touch sub/a && echo x >> sub/a && mv sub/a b && rm b`)))(t)
	var got []string
	for len(got) < 4 {
		e := watchNext(t, w)
		s := e.Type + " " + e.Path
		if e.OldPath != "" {
			s += " from " + e.OldPath
		}
		got = append(got, s)
	}
	if want := []string{"create sub/a", "write sub/a", "rename b from sub/a", "remove b"}; !slices.Equal(got, want) {
		t.Fatalf("events %q, want %q", got, want)
	}

	// 100,000 quick writes while the client does not read: an overflow event, and the
	// daemon's queue stays bounded (the fsxfer tests check its size).
	must(l.Exec(ctx, sh(`mkdir -p a-directory-with-a-rather-long-name-for-bigger-events`)))(t)
	e := watchNext(t, w)
	if e.Type != apitype.WatchCreate {
		t.Fatalf("mkdir: %+v", e)
	}
	res := must(l.Exec(ctx, apitype.ExecRequest{Argv: []string{"/bin/sh", "-c", `cd a-directory-with-a-rather-long-name-for-bigger-events
i=0; while [ $i -lt 100000 ]; do echo x >> file-number-$((i % 64)); i=$((i + 1)); done`}, TimeoutSeconds: 300}))(t)
	if res.ExitCode != 0 {
		t.Fatalf("writes: %+v", res)
	}
	overflow := false
	for n := 0; !overflow && n < 200_000; n++ {
		e := watchNext(t, w)
		overflow = e.Type == apitype.WatchOverflow
	}
	if !overflow {
		t.Fatal("no overflow event after 100,000 writes")
	}

	// The watch ends with the lease.
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for {
		e, err := w.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("after release: %v", err)
		}
		if e.Type == apitype.WatchEnd && e.Reason == "" {
			t.Fatal("end without a reason")
		}
	}
}
