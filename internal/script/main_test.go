package script

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/internal/confine"
)

// workerBin is the test worker binary (testdata/worker), built once by TestMain.
var workerBin string

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "sidecar-script-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	// Workers run as nobody when the tests run as root: the binary must be reachable.
	if err := os.Chmod(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	workerBin = filepath.Join(dir, "worker")
	build := exec.Command("go", "build", "-o", workerBin, "./testdata/worker")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build test worker:", err)
		return 1
	}
	// One compilation cache for the whole run: only the first worker pays the compile.
	cache, err := os.MkdirTemp("", "sidecar-script-testcache-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(cache)
	testCache = cache
	defer removeCgroupParent()
	return m.Run()
}

var testCache string

// testCgroupParent is the cgroup parent of this test process's cells, which TestMain
// removes at the end; cells numbers them.
var (
	testCgroupParent = fmt.Sprintf("sidecar-script-test-%d", os.Getpid())
	cells            atomic.Int64
)

// removeCgroupParent removes the test's cgroup parent in every hierarchy (v1), or the
// one (v2): only empty cgroups go.
func removeCgroupParent() {
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*/" + testCgroupParent)
	for _, d := range append(dirs, "/sys/fs/cgroup/"+testCgroupParent) {
		_ = syscall.Rmdir(d)
	}
}

// newRunner starts a Runner on the test worker and closes it with the test.
func newRunner(t testing.TB, mod func(*Config)) *Runner {
	t.Helper()
	cfg := Config{
		Enabled:    true,
		HelperPath: workerBin,
		WorkerArgs: []string{},
		CacheDir:   testCache,
		Logger:     slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	if os.Geteuid() == 0 {
		// As the daemon does: the workers in a cell under the cgroup parent.
		cell, err := confine.NewCell(testCgroupParent, fmt.Sprintf("t%d", cells.Add(1)), nil)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Cell = cell
	}
	if mod != nil {
		mod(&cfg)
	}
	r, err := New(context.Background(), cfg)
	if err != nil {
		if cell, ok := cfg.Cell.(*confine.Cell); ok {
			_ = cell.Remove(context.Background())
		}
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return r
}

// run runs src with input and a generous per-test deadline.
func run(t testing.TB, r *Runner, src, input string) (Result, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return r.Run(ctx, Request{Source: src, Input: []byte(input)})
}
