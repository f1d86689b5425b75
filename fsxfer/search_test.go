package fsxfer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func foundPaths(r FindResult) []string {
	out := []string{}
	for _, e := range r.Entries {
		out = append(out, e.Path)
	}
	return out
}

func TestFindGlobsDepthHiddenPaging(t *testing.T) {
	l := newTestLease(t)
	writeTree(t, l.work, map[string]string{
		"a.go": "", "b.txt": "", "src/x.go": "", "src/deep/y.go": "", "src/deep/z.md": "",
		".hidden/h.go": "", "src/.env": "", "link": "->src",
	})
	f := openFS(t, l.config())
	ctx := context.Background()
	find := func(o FindOptions) []string {
		t.Helper()
		r, err := f.Find(ctx, "", o)
		if err != nil {
			t.Fatal(err)
		}
		return foundPaths(r)
	}
	for _, tc := range []struct {
		opts FindOptions
		want []string
	}{
		{FindOptions{}, []string{"a.go", "b.txt", "link", "src", "src/deep", "src/deep/y.go", "src/deep/z.md", "src/x.go"}},
		{FindOptions{TreeOptions: TreeOptions{Include: []string{"*.go"}}}, []string{"a.go", "src/deep/y.go", "src/x.go"}},
		{FindOptions{TreeOptions: TreeOptions{Include: []string{"src/**/*.go"}}}, []string{"src/deep/y.go", "src/x.go"}},
		{FindOptions{TreeOptions: TreeOptions{Include: []string{"*.go"}, Hidden: true}}, []string{".hidden/h.go", "a.go", "src/deep/y.go", "src/x.go"}},
		{FindOptions{TreeOptions: TreeOptions{MaxDepth: 1}}, []string{"a.go", "b.txt", "link", "src"}},
		{FindOptions{TreeOptions: TreeOptions{Exclude: []string{"deep"}}}, []string{"a.go", "b.txt", "link", "src", "src/x.go"}},
		{FindOptions{Type: "dir"}, []string{"src", "src/deep"}},
		{FindOptions{Type: "symlink"}, []string{"link"}},
		{FindOptions{After: "src/deep"}, []string{"src/deep/y.go", "src/deep/z.md", "src/x.go"}},
	} {
		if got := find(tc.opts); !slices.Equal(got, tc.want) {
			t.Errorf("%+v: got %q, want %q", tc.opts, got, tc.want)
		}
	}
	// Paging: pages of 3 resume exactly where the previous stopped.
	var all []string
	after := ""
	for range 10 {
		r, err := f.Find(ctx, "", FindOptions{Limit: 3, After: after})
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, foundPaths(r)...)
		if !r.Truncated {
			break
		}
		if r.Reason != "limit" || r.Next == "" {
			t.Fatalf("truncated page: %+v", r)
		}
		after = r.Next
	}
	if want := find(FindOptions{}); !slices.Equal(all, want) {
		t.Fatalf("paged %q, want %q", all, want)
	}
	// Exactly the limit is not truncated.
	if r, _ := f.Find(ctx, "", FindOptions{Limit: 8}); r.Truncated || len(r.Entries) != 8 {
		t.Fatalf("limit equal to the count: %+v", r)
	}
	if _, err := f.Find(ctx, "", FindOptions{TreeOptions: TreeOptions{Include: []string{"[a"}}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad glob: %v", err)
	}
	if _, err := f.Find(ctx, "a.go", FindOptions{}); !errors.Is(err, ErrNotDir) {
		t.Fatalf("find on a file: %v", err)
	}
}

func TestFindGitIgnore(t *testing.T) {
	l := newTestLease(t)
	writeTree(t, l.work, map[string]string{
		".gitignore":        "# comment\n*.log\n/build/\n!keep.log\nnode_modules\ndocs/**/*.tmp\n",
		"a.log":             "",
		"keep.log":          "",
		"build/out":         "",
		"sub/build/kept.go": "",
		"sub/x.log":         "",
		"sub/.gitignore":    "*.go\n",
		"sub/node_modules/": "",
		"docs/a/b/c.tmp":    "",
		"docs/a/b/c.md":     "",
	})
	f := openFS(t, l.config())
	r, err := f.Find(context.Background(), "", FindOptions{Type: "file", TreeOptions: TreeOptions{GitIgnore: true}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"docs/a/b/c.md", "keep.log"}
	if got := foundPaths(r); !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestFindTimeLimit(t *testing.T) {
	l := newTestLease(t)
	writeTree(t, l.work, map[string]string{"a": "", "b": ""})
	f := openFS(t, l.config())
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	r, err := f.Find(ctx, "", FindOptions{})
	if err != nil || !r.Truncated || r.Reason != "time" {
		t.Fatalf("expired deadline: %+v %v", r, err)
	}
}

func TestFindNeverLeaves(t *testing.T) {
	l := newTestLease(t)
	writeTree(t, l.work, map[string]string{"etc": "->/etc", "out": "->../../outside", "mnt/": "", "in/a": "needle"})
	if err := unix.Mkfifo(filepath.Join(l.work, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	bindMount(t, l.outside, filepath.Join(l.work, "mnt"))
	if err := os.WriteFile(filepath.Join(l.work, "in", "foreign"), []byte("needle"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(l.work, "in", "foreign"), 4242, 4242); err != nil {
		t.Fatal(err)
	}
	f := openFS(t, l.config())
	r, err := f.Find(context.Background(), "", FindOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// A file of another uid is listed by name (as ls would), never read.
	if got, want := foundPaths(r), []string{"etc", "fifo", "in", "in/a", "in/foreign", "mnt", "out"}; !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
	for _, e := range r.Entries {
		if e.Path == "mnt" && !e.Mount {
			t.Fatal("mount point not flagged")
		}
	}
	g, err := f.Grep(context.Background(), "", GrepOptions{Pattern: "e", Fixed: true})
	if err != nil {
		t.Fatal(err)
	}
	g.Release()
	if len(g.Matches) != 1 || g.Matches[0].Path != "in/a" {
		t.Fatalf("grep left the lease's files: %+v", g)
	}
	if _, err := f.Find(context.Background(), "etc", FindOptions{}); !errors.Is(err, ErrOutside) {
		t.Fatalf("find through a symlink out: %v", err)
	}
	for _, p := range []string{"mnt", "mnt/secret.txt", "mnt/dir"} {
		if _, err := f.Grep(context.Background(), p, GrepOptions{Pattern: "secret"}); !errors.Is(err, ErrMountPoint) {
			t.Errorf("grep %s across a mount: %v", p, err)
		}
		if _, err := f.Find(context.Background(), p, FindOptions{}); !errors.Is(err, ErrMountPoint) && !errors.Is(err, ErrNotDir) {
			t.Errorf("find %s across a mount: %v", p, err)
		}
	}
	if _, err := f.Watch("mnt", WatchOptions{}); !errors.Is(err, ErrMountPoint) {
		t.Errorf("watch across a mount: %v", err)
	}
}

// refGrep is the line-by-line definition the fast matcher must agree with.
func refGrep(content, pattern string) []string {
	re := regexp.MustCompile(pattern)
	var out []string
	if content == "" {
		return nil // an empty file has no lines
	}
	lines := strings.Split(content, "\n")
	if strings.HasSuffix(content, "\n") {
		lines = lines[:len(lines)-1]
	}
	for i, ln := range lines {
		if loc := re.FindStringIndex(ln); loc != nil {
			out = append(out, fmt.Sprintf("%d:%d:%s", i+1, loc[0]+1, ln))
		}
	}
	return out
}

func TestMatcherAgreesWithLineByLine(t *testing.T) {
	contents := []string{"", "\n", "a", "foo\nbar\n", "x\nxz\n", "abc\n\ndef", "  foo bar\nfoo\nbarfoo\n", "a\nb\nc\n\n\n", "héllo wörld\nHÉLLO\n"}
	patterns := []string{"foo", "^foo", "foo$", "^$", "^", "$", "x[^y]*z", `\bbar\b`, `a\sb`, `(?i)héllo`, `(?s)a.b`, `\Afoo`, `bar\z`, ".*", "o+", `[a-z]+\n?`}
	for _, c := range contents {
		for _, p := range patterns {
			m, err := newMatcher(p, false, false)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			buf := []byte(c)
			line, at := 1, 0
			m.each(buf, func(s, e, col int) bool {
				line += strings.Count(c[at:s], "\n")
				at = s
				got = append(got, fmt.Sprintf("%d:%d:%s", line, col, c[s:e]))
				return true
			})
			if want := refGrep(c, p); !slices.Equal(got, want) {
				t.Errorf("%q on %q: got %q, want %q", p, c, got, want)
			}
		}
	}
}

func TestGrepOptions(t *testing.T) {
	l := newTestLease(t)
	big := strings.Repeat("x", MaxGrepLineBytes+10) + "needle\n"
	writeTree(t, l.work, map[string]string{
		"a.txt": "one\ntwo needle\nthree\nfour\nNEEDLE five\n",
		"b.go":  "needle\n",
		"bin":   "needle\x00\n",
		"long":  big,
		"huge":  "needle " + strings.Repeat("y", 2000) + "\n",
	})
	f := openFS(t, l.config())
	ctx := context.Background()
	g, err := f.Grep(ctx, "", GrepOptions{Pattern: "needle", Fixed: true, IgnoreCase: true, Context: 1, MaxFileBytes: 1500})
	if err != nil {
		t.Fatal(err)
	}
	g.Release()
	var got []string
	for _, m := range g.Matches {
		got = append(got, fmt.Sprintf("%s:%d:%d:%d:%v:%q:%q", m.Path, m.Line, m.Column, len(m.Text), m.Cut, m.Before, m.After))
	}
	want := []string{
		`a.txt:2:5:10:false:["one"]:["three"]`,
		`a.txt:5:1:11:false:["four"]:[]`,
		`b.go:1:1:6:false:[]:[]`,
		fmt.Sprintf(`long:1:%d:%d:true:[]:[]`, MaxGrepLineBytes+11, MaxGrepLineBytes),
	}
	if !slices.Equal(got, want) {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if g.SkippedBinary != 1 || g.SkippedLarge != 1 || g.Files != 3 || g.Truncated {
		t.Fatalf("counts: %+v", g)
	}
	g, err = f.Grep(ctx, "", GrepOptions{Pattern: "needle", MaxMatches: 1, TreeOptions: TreeOptions{Include: []string{"*.txt", "*.go"}}})
	if err != nil {
		t.Fatal(err)
	}
	g.Release()
	if len(g.Matches) != 1 || !g.Truncated || g.Reason != "matches" {
		t.Fatalf("max matches: %+v", g)
	}
	g, _ = f.Grep(ctx, "", GrepOptions{Pattern: "needle", MaxMatches: 2, TreeOptions: TreeOptions{Include: []string{"*.txt", "*.go"}}})
	g.Release()
	if len(g.Matches) != 2 || g.Truncated {
		t.Fatalf("under max matches: %+v", g)
	}
	g, _ = f.Grep(ctx, "a.txt", GrepOptions{Pattern: "^t"})
	g.Release()
	if len(g.Matches) != 2 || g.Matches[0].Path != "a.txt" || g.Matches[1].Line != 3 {
		t.Fatalf("one file: %+v", g)
	}
	if _, err := f.Grep(ctx, "", GrepOptions{Pattern: "("}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad regexp: %v", err)
	}
}

func TestReplaceAndConditionalWrite(t *testing.T) {
	l := newTestLease(t)
	writeTree(t, l.work, map[string]string{"f.go": "a := 1\nb := 1\nc := 2\n"})
	if err := os.Chmod(filepath.Join(l.work, "f.go"), 0o600); err != nil {
		t.Fatal(err)
	}
	f := openFS(t, l.config())
	ctx := context.Background()
	read := func() string {
		b, err := os.ReadFile(filepath.Join(l.work, "f.go"))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	before, _ := f.Stat("f.go")
	if _, _, err := f.Replace(ctx, "f.go", ReplaceOptions{Old: "zzz", New: "y"}); !errors.Is(err, ErrNoMatch) {
		t.Fatalf("absent: %v", err)
	}
	if _, _, err := f.Replace(ctx, "f.go", ReplaceOptions{Old: ":= 1", New: "= 1"}); !errors.Is(err, ErrAmbiguous) {
		t.Fatalf("ambiguous: %v", err)
	}
	if _, _, err := f.Replace(ctx, "f.go", ReplaceOptions{Old: "c := 2", New: "c := 3", IfMatch: `"1-2"`}); !errors.Is(err, ErrPrecondition) {
		t.Fatalf("stale etag: %v", err)
	}
	if got := read(); got != "a := 1\nb := 1\nc := 2\n" {
		t.Fatalf("refused replacements changed the file: %q", got)
	}
	n, info, err := f.Replace(ctx, "f.go", ReplaceOptions{Old: "c := 2", New: "c := 3", IfMatch: before.ETag()})
	if err != nil || n != 1 || read() != "a := 1\nb := 1\nc := 3\n" || info.Mode.Perm() != 0o600 {
		t.Fatalf("unique: n=%d info=%+v err=%v %q", n, info, err, read())
	}
	n, _, err = f.Replace(ctx, "f.go", ReplaceOptions{Old: ":= 1", New: "= 9", All: true})
	if err != nil || n != 2 || read() != "a = 9\nb = 9\nc := 3\n" {
		t.Fatalf("all: n=%d err=%v %q", n, err, read())
	}
	// Conditional writes.
	if _, err := f.WriteFile(ctx, "f.go", strings.NewReader("x"), WriteOptions{IfMatch: before.ETag()}); !errors.Is(err, ErrPrecondition) {
		t.Fatalf("stale If-Match write: %v", err)
	}
	if _, err := f.WriteFile(ctx, "new", strings.NewReader("x"), WriteOptions{IfMatch: "*"}); !errors.Is(err, ErrPrecondition) {
		t.Fatalf("If-Match * on a missing file: %v", err)
	}
	cur, _ := f.Stat("f.go")
	if _, err := f.WriteFile(ctx, "f.go", strings.NewReader("x"), WriteOptions{IfMatch: cur.ETag()}); err != nil || read() != "x" {
		t.Fatalf("fresh If-Match write: %v", err)
	}
	if leftovers := listTree(t, l.work); !slices.Equal(leftovers, []string{"f.go"}) {
		t.Fatalf("left behind: %q", leftovers)
	}
}

func TestReadLines(t *testing.T) {
	l := newTestLease(t)
	writeTree(t, l.work, map[string]string{"f": "1\n2\n3\n4\n5", "empty": "", "long": "a\n" + strings.Repeat("x", MaxReadLineBytes+5) + "\nb\n"})
	f := openFS(t, l.config())
	for _, tc := range []struct {
		path          string
		offset, limit int
		data          string
		count         int
		more          bool
	}{
		{"f", 0, 2, "1\n2\n", 2, true},
		{"f", 3, 0, "4\n5", 2, false},
		{"f", 3, 2, "4\n5", 2, false},
		{"f", 2, 2, "3\n4\n", 2, true},
		{"f", 9, 2, "", 0, false},
		{"empty", 0, 5, "", 0, false},
		{"long", 0, 3, "a\n", 1, true},
	} {
		got, err := f.ReadLines(tc.path, tc.offset, tc.limit)
		if err != nil || string(got.Data) != tc.data || got.Count != tc.count || got.More != tc.more {
			t.Errorf("%s %d+%d: %q %d %v %v", tc.path, tc.offset, tc.limit, shorten(string(got.Data)), got.Count, got.More, err)
		}
	}
	got, err := f.ReadLines("long", 1, 3)
	if err != nil || len(got.Data) != MaxReadLineBytes || got.Count != 1 || !got.More {
		t.Fatalf("a line over the cap: %d %d %v %v", len(got.Data), got.Count, got.More, err)
	}
}

// The content cache serves an unchanged file and never a changed one.
func TestGrepCache(t *testing.T) {
	l := newTestLease(t)
	writeTree(t, l.work, map[string]string{"a": "old needle\n", "b": "needle\n"})
	f := openFS(t, l.config())
	ctx := context.Background()
	defer func(now func() time.Time) { cacheNow = now }(cacheNow)
	cacheNow = func() time.Time { return time.Now().Add(time.Hour) } // everything counts as settled
	grep := func() []string {
		t.Helper()
		g, err := f.Grep(ctx, "", GrepOptions{Pattern: "needle", Fixed: true})
		if err != nil {
			t.Fatal(err)
		}
		g.Release()
		var out []string
		for _, m := range g.Matches {
			out = append(out, m.Path+":"+m.Text)
		}
		return out
	}
	hits := func() int64 {
		contentCache.mu.Lock()
		defer contentCache.mu.Unlock()
		return contentCache.hits
	}
	want := []string{"a:old needle", "b:needle"}
	if got := grep(); !slices.Equal(got, want) {
		t.Fatalf("first: %q", got)
	}
	before := hits()
	if got := grep(); !slices.Equal(got, want) || hits()-before != 2 {
		t.Fatalf("second: %q, %d hits", got, hits()-before)
	}
	// Same size, same inode, rewritten in place once the coarse clock has moved on
	// (ctime then differs), and replaced by a rename (another inode).
	ca := statCtime(t, filepath.Join(l.work, "a"))
	for scratch := filepath.Join(l.work, ".scratch"); ; {
		if err := os.WriteFile(scratch, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if statCtime(t, scratch) != ca {
			break
		}
	}
	if err := os.WriteFile(filepath.Join(l.work, "a"), []byte("new needle\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(l.work, "b.new"), []byte("NEEDLE\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(l.work, "b.new"), filepath.Join(l.work, "b")); err != nil {
		t.Fatal(err)
	}
	if got := grep(); !slices.Equal(got, []string{"a:new needle"}) {
		t.Fatalf("after changes: %q", got)
	}
	// A file changed within the settle time is not cached at all.
	cacheNow = time.Now
	writeTree(t, l.work, map[string]string{"c": "fresh needle\n"})
	before = hits()
	grep()
	grep()
	if n := hits() - before; n != 4 { // a and b twice each, never c
		t.Fatalf("%d hits, want 4 (a and b, not c)", n)
	}
}

func statCtime(t *testing.T, p string) unix.Timespec {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ctim
}

// Find's and Grep's numeric options: 0 takes the default, beyond the maximum (or below 0)
// is ErrInvalid naming the option, and the first option out of bounds is the one named.
func TestSearchOptionBounds(t *testing.T) {
	fo := FindOptions{}
	if err := fo.normalize(); err != nil || fo.Limit != DefaultFindLimit || fo.Timeout != DefaultFindTimeout {
		t.Fatalf("find defaults: %+v %v", fo, err)
	}
	go0 := GrepOptions{}
	if err := go0.normalize(); err != nil || go0.Context != 0 || go0.MaxMatches != DefaultGrepMatches ||
		go0.MaxFileBytes != DefaultGrepFileBytes || go0.Timeout != DefaultGrepTimeout {
		t.Fatalf("grep defaults: %+v %v", go0, err)
	}
	for _, c := range []struct {
		opts interface{ normalize() error }
		want string
	}{
		{&FindOptions{Limit: MaxFindLimit + 1}, "limit must be 0..100000"},
		{&FindOptions{Limit: -1, Timeout: -1}, "limit must be"},
		{&FindOptions{Timeout: MaxFindTimeout + 1}, "timeout must be at most 1m0s"},
		{&GrepOptions{Context: MaxGrepContext + 1, MaxMatches: -1}, "context must be 0..10"},
		{&GrepOptions{MaxMatches: MaxGrepMatches + 1}, "max matches must be 0..100000"},
		{&GrepOptions{MaxFileBytes: -1}, "max file bytes must be 0..67108864"},
		{&GrepOptions{Timeout: MaxGrepTimeout + 1}, "timeout must be at most 2m0s"},
	} {
		err := c.opts.normalize()
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want ErrInvalid with %q", c.opts, err, c.want)
		}
	}
}
