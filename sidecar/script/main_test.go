package script

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
	return m.Run()
}

var testCache string

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
	// A cgroup named after the test, so that runs and packages never collide.
	cfg.CgroupName = fmt.Sprintf("sidecar-scripts-test-%s-%d", strings.ReplaceAll(t.Name(), "/", "_"), os.Getpid())
	if mod != nil {
		mod(&cfg)
	}
	r, err := New(context.Background(), cfg)
	if err != nil {
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
