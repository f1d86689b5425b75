package fsxfer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func nextEvents(t *testing.T, w *Watcher, n int) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []string
	for len(out) < n {
		e, err := w.Next(ctx)
		if err != nil {
			t.Fatalf("after %q: %v", out, err)
		}
		s := e.Type + " " + e.Path
		if e.OldPath != "" {
			s += " from " + e.OldPath
		}
		out = append(out, s)
	}
	return out
}

func TestWatchEventsInOrder(t *testing.T) {
	l := newTestLease(t)
	writeTree(t, l.work, map[string]string{"sub/": "", "etc": "->/etc"})
	f := openFS(t, l.config())
	w, err := f.Watch("", WatchOptions{Recursive: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	p := func(s string) string { return filepath.Join(l.work, s) }
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(p("sub/a"), nil, 0o644))
	h, err := os.OpenFile(p("sub/a"), os.O_APPEND|os.O_WRONLY, 0)
	must(err)
	_, err = h.WriteString("x\n")
	must(err)
	must(h.Close())
	must(os.Rename(p("sub/a"), p("b")))
	must(os.Remove(p("b")))
	must(os.MkdirAll(p("new/deep"), 0o755))
	must(os.WriteFile(p("new/deep/c"), nil, 0o644))
	got := nextEvents(t, w, 6)
	want := []string{"create sub/a", "write sub/a", "rename b from sub/a", "remove b", "create new"}
	if !slices.Equal(got[:5], want) {
		t.Fatalf("got %q, want %q first", got, want)
	}
	// The new directory's contents show up, whether found by the scan or by the watch.
	rest := append(got[5:], nextEvents(t, w, 1)...)
	if !slices.Contains(rest, "create new/deep") {
		t.Fatalf("new subdirectory: %q", rest)
	}
	for !slices.Contains(rest, "create new/deep/c") {
		rest = append(rest, nextEvents(t, w, 1)...)
	}
	// Closing the FS (the lease's end) ends the watch.
	f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		_, err := w.Next(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestWatchOverflowIsBounded(t *testing.T) {
	l := newTestLease(t)
	f := openFS(t, l.config())
	w, err := f.Watch("", WatchOptions{Queue: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for i := range 1000 {
		if err := os.WriteFile(filepath.Join(l.work, fmt.Sprint("f", i)), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	seen, overflow := 0, false
	for !overflow {
		e, err := w.Next(ctx)
		if err != nil {
			t.Fatalf("after %d events: %v", seen, err)
		}
		seen++
		overflow = e.Type == EventOverflow && e.Dropped > 0
		if seen > 101 {
			t.Fatalf("more than the queue held before the overflow event")
		}
	}
	w.mu.Lock()
	n := len(w.queue)
	w.mu.Unlock()
	if n > 100 {
		t.Fatalf("queue grew to %d", n)
	}
}

func TestWatchLimits(t *testing.T) {
	l := newTestLease(t)
	writeTree(t, l.work, map[string]string{"a/": "", "b/": "", "c/": "", "file": ""})
	f := openFS(t, l.config())
	w, err := f.Watch("", WatchOptions{Recursive: true, MaxDirs: 2})
	if err != nil {
		t.Fatal(err)
	}
	if got := nextEvents(t, w, 1); got[0] != "limit b" {
		t.Fatalf("limit: %q", got)
	}
	w.Close()
	if _, err := f.Watch("file", WatchOptions{}); !errors.Is(err, ErrNotDir) {
		t.Fatalf("watch a file: %v", err)
	}
	var ws []*Watcher
	for range MaxWatchesPerFS {
		w, err := f.Watch("", WatchOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
	}
	if _, err := f.Watch("", WatchOptions{}); !errors.Is(err, ErrWatchLimit) {
		t.Fatalf("one watch too many: %v", err)
	}
	for _, w := range ws {
		w.Close()
	}
}
