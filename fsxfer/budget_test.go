package fsxfer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp/syntax"
	"slices"
	"strings"
	"testing"
)

func newBudgets(t *testing.T, cfg BudgetConfig) *Budgets {
	t.Helper()
	b, err := NewBudgets(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The attack's pattern (a{1000} repeated to fill the header limit) is refused by its
// cost, before anything is compiled; the count is never below the program Go compiles.
func TestGrepPatternCost(t *testing.T) {
	l := newTestLease(t)
	writeTree(t, l.work, map[string]string{"a.txt": "aaa\n"})
	f := openFS(t, l.config())
	attack := strings.Repeat("a{1000}", 2600) // 18 KiB, 2.6 million instructions
	for _, p := range []string{attack, "a{1000}" + strings.Repeat("b", MaxGrepProgram), strings.Repeat(`\w{999}`, 11)} {
		_, err := f.Grep(context.Background(), "", GrepOptions{Pattern: p})
		if !errors.Is(err, ErrPatternTooComplex) || !strings.Contains(err.Error(), fmt.Sprint(MaxGrepProgram)) {
			t.Errorf("pattern of %d bytes: %v, want ErrPatternTooComplex naming the limit", len(p), err)
		}
	}
	if f.searches.Load() != 0 || f.budgets.searchFree.Load() != f.budgets.cfg.SearchBytes {
		t.Fatalf("a refused pattern holds the budget: %d searches, %d free", f.searches.Load(), f.budgets.searchFree.Load())
	}
	// Just under the limit: compiled and run.
	g, err := f.Grep(context.Background(), "", GrepOptions{Pattern: strings.Repeat("a{1000}", MaxGrepProgram/1000-1) + "|aaa"})
	if err != nil || len(g.Matches) != 1 {
		t.Fatalf("pattern under the limit: %+v, %v", g, err)
	}
	g.Release()
	for _, p := range []string{"a", "abc", "(?i)needle", "a{3,7}", "(ab|cd)*e+", `^\s*func\s+(\w+)\(`, "x{2,}", "[a-z]{10}[0-9]?",
		"(?i)" + strings.Repeat("a", 300), "(a|b|c|d){20}", `\bfoo\b|bar$`} {
		tree, err := syntax.Parse(p, syntax.Perl)
		if err != nil {
			t.Fatal(err)
		}
		prog, err := syntax.Compile(tree.Simplify())
		if err != nil {
			t.Fatal(err)
		}
		// The compiled program adds a fail, a match and the implicit capture around it.
		if got, real := progSize(tree), int64(len(prog.Inst)); got < real-4 {
			t.Errorf("%q: counted %d instructions, compiled to %d", p, got, real)
		}
	}
}

// Searches take a slot of the lease and one of the daemon until their result is
// released; beyond either, ErrSearchLimit naming the limit.
func TestGrepConcurrencyLimits(t *testing.T) {
	b := newBudgets(t, BudgetConfig{MaxSearches: MaxSearchesPerLease + 1})
	var fs []*FS
	for range 2 {
		l := newTestLease(t)
		writeTree(t, l.work, map[string]string{"a.txt": "needle\n"})
		cfg := l.config()
		cfg.Budgets = b
		fs = append(fs, openFS(t, cfg))
	}
	grep := func(f *FS) (GrepResult, error) {
		return f.Grep(context.Background(), "", GrepOptions{Pattern: "ne+dle"})
	}
	var held []GrepResult
	for range MaxSearchesPerLease {
		g, err := grep(fs[0])
		if err != nil || len(g.Matches) != 1 {
			t.Fatalf("search within the lease's slots: %+v, %v", g, err)
		}
		held = append(held, g)
	}
	if _, err := grep(fs[0]); !errors.Is(err, ErrSearchLimit) || !strings.Contains(err.Error(), "lease") {
		t.Fatalf("one search over the lease's slots: %v", err)
	}
	g, err := grep(fs[1]) // the daemon's last slot
	if err != nil {
		t.Fatal(err)
	}
	if _, err := grep(fs[1]); !errors.Is(err, ErrSearchLimit) || !strings.Contains(err.Error(), "SIDECAR_MAX_SEARCHES") {
		t.Fatalf("one search over the daemon's slots: %v", err)
	}
	held[0].Release()
	held[0].Release() // twice is once
	g2, err := grep(fs[1])
	if err != nil {
		t.Fatalf("a released slot is free again: %v", err)
	}
	if _, err := grep(fs[0]); !errors.Is(err, ErrSearchLimit) {
		t.Fatalf("a slot released twice counted twice: %v", err)
	}
	g.Release()
	g2.Release()
	for _, g := range held[1:] {
		g.Release()
	}
	if b.searches.Load() != 0 || b.searchFree.Load() != b.cfg.SearchBytes {
		t.Fatalf("released searches hold the budget: %d searches, %d of %d bytes free", b.searches.Load(), b.searchFree.Load(), b.cfg.SearchBytes)
	}
}

// A search's pattern, large files and matches are charged to the daemon's search
// budget: a pattern it cannot hold is refused; a search that spends it mid-way returns
// the first matches in walk order, truncated with reason "memory"; a released result
// gives everything back.
func TestGrepMemoryBudget(t *testing.T) {
	const budget = 256 << 10
	b := newBudgets(t, BudgetConfig{SearchBytes: budget})
	l := newTestLease(t)
	files := map[string]string{}
	for i := range 40 {
		files[fmt.Sprintf("d/f%02d.txt", i)] = strings.Repeat(fmt.Sprintf("needle %02d %s\n", i, strings.Repeat("x", 900)), 10)
	}
	files["huge.txt"] = strings.Repeat("y", 2*budget) + "\nneedle\n"
	writeTree(t, l.work, files)
	cfg := l.config()
	cfg.Budgets = b
	f := openFS(t, cfg)
	ctx := context.Background()

	_, err := f.Grep(ctx, "", GrepOptions{Pattern: strings.Repeat("a", budget/GrepInstBytes+1) + "|b"})
	if !errors.Is(err, ErrSearchLimit) || !strings.Contains(err.Error(), "SIDECAR_SEARCH_BUDGET_BYTES") {
		t.Fatalf("a pattern over the budget: %v", err)
	}
	g, err := f.Grep(ctx, "huge.txt", GrepOptions{Pattern: "needle", Fixed: true})
	if err != nil || !g.Truncated || g.Reason != "memory" || len(g.Matches) != 0 {
		t.Fatalf("a file larger than the budget: %+v, %v", g, err)
	}
	g.Release()

	g, err = f.Grep(ctx, "d", GrepOptions{Pattern: "needle", Fixed: true, MaxMatches: MaxGrepMatches})
	if err != nil || !g.Truncated || g.Reason != "memory" {
		t.Fatalf("matches over the budget: truncated %v reason %q, %v", g.Truncated, g.Reason, err)
	}
	if len(g.Matches) == 0 || len(g.Matches) >= 400 {
		t.Fatalf("matches over the budget: %d of 400 returned", len(g.Matches))
	}
	for i, m := range g.Matches { // the first ones, in walk order
		if want := fmt.Sprintf("f%02d.txt", i/10); m.Path != want || m.Line != i%10+1 {
			t.Fatalf("match %d is %s:%d, want %s:%d", i, m.Path, m.Line, want, i%10+1)
		}
	}
	if held := budget - b.searchFree.Load(); held <= 0 || held > budget {
		t.Fatalf("a result holds %d bytes of the budget", held)
	}
	g.Release()
	if b.searchFree.Load() != budget || b.searches.Load() != 0 {
		t.Fatalf("after release: %d of %d bytes free, %d searches", b.searchFree.Load(), budget, b.searches.Load())
	}
	// Within the budget nothing changes.
	g, err = f.Grep(ctx, "d", GrepOptions{Pattern: "needle 0[0-3]", MaxMatches: MaxGrepMatches})
	if err != nil || g.Truncated || len(g.Matches) != 40 {
		t.Fatalf("within the budget: %d matches, truncated %v %q, %v", len(g.Matches), g.Truncated, g.Reason, err)
	}
	g.Release()
}

// inotifyFDs counts this process's inotify instances.
func inotifyFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && target == "anon_inode:inotify" {
			n++
		}
	}
	return n
}

// The daemon's inotify budget is a quarter of the host's per-user limits and a lease's
// a quarter of that; neither reaches the host's limits.
func TestInotifyBudgetsFromHost(t *testing.T) {
	inst, watches := HostInotifyLimits()
	b := newBudgets(t, BudgetConfig{})
	c := b.Config()
	leaseInst, leaseWatches := b.LeaseInotify()
	t.Logf("host: %d instances, %d watches; daemon: %d, %d; lease: %d, %d", inst, watches, c.InotifyInstances, c.InotifyWatches, leaseInst, leaseWatches)
	if c.InotifyInstances != max(1, inst/InotifyShare) || c.InotifyWatches != max(1, watches/InotifyShare) {
		t.Fatalf("daemon budget %d instances, %d watches; want a quarter of the host's %d, %d", c.InotifyInstances, c.InotifyWatches, inst, watches)
	}
	if 2*c.InotifyInstances > inst/2 && inst >= 4 || 2*c.InotifyWatches > watches/2 {
		t.Fatalf("two daemons would take more than half of root's inotify limits")
	}
	if leaseInst > MaxWatchesPerFS || leaseInst > max(1, c.InotifyInstances/LeaseInotifyShare) || leaseWatches > MaxWatchDirs || leaseWatches > max(1, c.InotifyWatches/LeaseInotifyShare) {
		t.Fatalf("lease budget %d instances, %d watches", leaseInst, leaseWatches)
	}
}

// Watches are charged to the lease's and the daemon's inotify budgets: the instance of
// each watch and every directory it watches. A watch that cannot start within them is
// refused with ErrWatchLimit naming which; a directory that appears later and cannot be
// watched is a refused event (never a limit event); everything is given back when the
// watches end.
func TestWatchInotifyBudgets(t *testing.T) {
	b := newBudgets(t, BudgetConfig{InotifyInstances: 8, InotifyWatches: 40}) // a lease: 2 instances, 10 watches
	if i, w := b.LeaseInotify(); i != 2 || w != 10 {
		t.Fatalf("lease share %d, %d", i, w)
	}
	before := inotifyFDs(t)
	var fss []*FS
	for range 5 {
		l := newTestLease(t)
		tree := map[string]string{}
		for i := range 12 {
			tree[fmt.Sprintf("big/d%02d/", i)] = ""
		}
		for i := range 4 {
			tree[fmt.Sprintf("small/d%d/", i)] = ""
		}
		writeTree(t, l.work, tree)
		cfg := l.config()
		cfg.Budgets = b
		fss = append(fss, openFS(t, cfg))
	}
	f := fss[0]
	// A recursive watch of 13 directories is over the lease's 10: refused whole.
	if _, err := f.Watch("big", WatchOptions{Recursive: true}); !errors.Is(err, ErrWatchLimit) || !strings.Contains(err.Error(), "lease") {
		t.Fatalf("a watch over the lease's watches: %v", err)
	}
	if b.inotifyInstances != 0 || b.inotifyWatches != 0 || inotifyFDs(t) != before {
		t.Fatalf("a refused watch holds %d instances, %d watches (%d inotify descriptors open, %d before)", b.inotifyInstances, b.inotifyWatches, inotifyFDs(t), before)
	}
	// Two watches are the lease's instances; a third is refused.
	w1, err := f.Watch("small", WatchOptions{Recursive: true}) // 5 directories
	if err != nil {
		t.Fatal(err)
	}
	w2, err := f.Watch("", WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Watch("", WatchOptions{}); !errors.Is(err, ErrWatchLimit) || !strings.Contains(err.Error(), "lease") {
		t.Fatalf("a third watch: %v", err)
	}
	// Three more leases take the daemon's other 6 instances; a fifth lease is refused.
	var more []*Watcher
	for _, g := range fss[1:4] {
		for range 2 {
			w, err := g.Watch("", WatchOptions{})
			if err != nil {
				t.Fatal(err)
			}
			more = append(more, w)
		}
	}
	if got := inotifyFDs(t) - before; got != 8 {
		t.Fatalf("%d inotify instances open, want the daemon's 8", got)
	}
	if _, err := fss[4].Watch("", WatchOptions{}); !errors.Is(err, ErrWatchLimit) || !strings.Contains(err.Error(), "max_user_instances") {
		t.Fatalf("a watch over the daemon's instances: %v", err)
	}
	for _, w := range more {
		w.Close()
	}
	// The lease holds 6 of its 10 watches: four new directories are watched, the fifth
	// is refused (an event), and once one goes away the next is watched again.
	for i := range 5 {
		if err := os.Mkdir(filepath.Join(l0(fss[0]), "small", fmt.Sprintf("n%d", i)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	got := nextEvents(t, w1, 6)
	want := []string{"create n0", "create n1", "create n2", "create n3", "create n4", "refused n4"}
	if !slices.Equal(got, want) {
		t.Fatalf("events %q, want %q", got, want)
	}
	if err := os.Remove(filepath.Join(l0(fss[0]), "small", "d0")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(l0(fss[0]), "small", "n5"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := nextEvents(t, w1, 2); !slices.Equal(got, []string{"remove d0", "create n5"}) {
		t.Fatalf("after a watched directory went away: %q", got)
	}
	if err := os.WriteFile(filepath.Join(l0(fss[0]), "small", "n5", "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := nextEvents(t, w1, 1); got[0] != "create n5/f" {
		t.Fatalf("the directory watched after one went away: %q", got)
	}
	w1.Close()
	w2.Close()
	if b.inotifyInstances != 0 || b.inotifyWatches != 0 || f.inotifyInstances != 0 || f.inotifyWatches != 0 || inotifyFDs(t) != before {
		t.Fatalf("after every watch closed: daemon %d instances, %d watches; lease %d, %d; %d inotify descriptors open, %d before",
			b.inotifyInstances, b.inotifyWatches, f.inotifyInstances, f.inotifyWatches, inotifyFDs(t), before)
	}
}

// l0 is the workdir of an FS.
func l0(f *FS) string { return f.cfg.Workdir }
