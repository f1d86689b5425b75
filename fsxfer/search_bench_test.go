package fsxfer

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// makeBenchTree writes 10,000 small source files in 200 directories.
func makeBenchTree(b *testing.B, dir string) {
	b.Helper()
	for d := range 200 {
		sub := filepath.Join(dir, fmt.Sprint("dir", d))
		if err := os.Mkdir(sub, 0o755); err != nil {
			b.Fatal(err)
		}
		for f := range 50 {
			body := fmt.Sprintf("package p%d\n\nfunc F%d_%d() int {\n", d, d, f)
			if f%3 == 0 {
				body += fmt.Sprintf("\treturn 1 // needle %d\n", f)
			}
			body += "}\n"
			if err := os.WriteFile(filepath.Join(sub, fmt.Sprintf("f%d.go", f)), []byte(body), 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkSearchTree compares Find and Grep alone (no HTTP, no sandbox) with find and
// grep -rn run on the same 10,000 files. Each iteration runs both, so both see the
// same machine load; the medians are reported (go-ms, exec-ms):
//
//	go test -run '^$' -bench SearchTree -benchtime 30x ./fsxfer/
func BenchmarkSearchTree(b *testing.B) {
	l := newTestLease(b)
	makeBenchTree(b, l.work)
	f := openFS(b, l.config())
	ctx := context.Background()
	run := func(b *testing.B, ours func() int, argv ...string) {
		var g, e []time.Duration
		for b.Loop() {
			t0 := time.Now()
			if ours() == 0 {
				b.Fatal("found nothing")
			}
			t1 := time.Now()
			cmd := exec.Command(argv[0], argv[1:]...)
			cmd.Dir = l.work
			if out, err := cmd.Output(); err != nil || len(out) == 0 {
				b.Fatal(err)
			}
			g, e = append(g, t1.Sub(t0)), append(e, time.Since(t1))
		}
		slices.Sort(g)
		slices.Sort(e)
		b.ReportMetric(float64(g[len(g)/2].Microseconds())/1000, "go-ms")
		b.ReportMetric(float64(e[len(e)/2].Microseconds())/1000, "exec-ms")
	}
	b.Run("find", func(b *testing.B) {
		run(b, func() int {
			r, err := f.Find(ctx, "", FindOptions{TreeOptions: TreeOptions{Include: []string{"*.go"}}, Limit: MaxFindLimit})
			if err != nil {
				b.Fatal(err)
			}
			return len(r.Entries)
		}, "find", ".", "-name", "*.go")
	})
	b.Run("grep-cold", func(b *testing.B) { // every file opened and read, as on a first search
		run(b, func() int {
			contentCache.mu.Lock()
			contentCache.entries, contentCache.bytes = map[uint64]*cacheEntry{}, 0
			contentCache.mu.Unlock()
			r, err := f.Grep(ctx, "", GrepOptions{Pattern: "needle", Fixed: true, MaxMatches: MaxGrepMatches})
			if err != nil {
				b.Fatal(err)
			}
			r.Release()
			return len(r.Matches)
		}, "grep", "-rn", "-F", "needle", ".")
	})
	b.Run("grep", func(b *testing.B) {
		run(b, func() int {
			r, err := f.Grep(ctx, "", GrepOptions{Pattern: "needle", Fixed: true, MaxMatches: MaxGrepMatches})
			if err != nil {
				b.Fatal(err)
			}
			r.Release()
			return len(r.Matches)
		}, "grep", "-rn", "-F", "needle", ".")
	})
}
