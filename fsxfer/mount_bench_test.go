package fsxfer

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkRemoveTreeMountsHeld removes a small lease-like tree (RemoveTree, as a release
// does, and FS.Remove, as the API's recursive remove does) while the mount namespace
// holds 0 or N more mounts, as a host holding one per lease does. The cost per removal
// must not grow with N:
//
//	go test -run X -bench RemoveTreeMountsHeld ./fsxfer
func BenchmarkRemoveTreeMountsHeld(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root to unshare a mount namespace and bind-mount")
	}
	for _, n := range []int{0, 200, 1000} {
		b.Run(fmt.Sprintf("RemoveTree/mounts=%d", n), func(b *testing.B) {
			inMountNamespace(b, n, func(scratch string) error {
				return removeTrees(b, filepath.Join(scratch, "lease"), RemoveTree)
			})
		})
		b.Run(fmt.Sprintf("FS.Remove/mounts=%d", n), func(b *testing.B) {
			inMountNamespace(b, n, func(scratch string) error {
				work := filepath.Join(scratch, "lease", "work")
				if err := os.MkdirAll(work, 0o755); err != nil {
					return err
				}
				f, err := Open(Config{Workdir: work, UsageRoot: filepath.Dir(work), UID: -1, GID: -1})
				if err != nil {
					return err
				}
				defer f.Close()
				return removeTrees(b, filepath.Join(work, "tree"), func(dir string) error {
					return f.Remove(filepath.Base(dir), true)
				})
			})
		})
	}
}

// removeTrees makes b.N trees named prefix<i>, then times their removal. It also
// reports the CPU time of the calling thread, user and system, per removal (cpu-ns/op):
// on a loaded machine wall time mostly measures the wait for a CPU, and what the kernel
// spends formatting a mount table is system time of the thread that reads it.
func removeTrees(b *testing.B, prefix string, remove func(dir string) error) error {
	for i := range b.N {
		if err := makeLeaseTree(fmt.Sprint(prefix, i)); err != nil {
			return err
		}
	}
	before := threadCPU()
	b.ResetTimer()
	for i := range b.N {
		if err := remove(fmt.Sprint(prefix, i)); err != nil {
			return err
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(threadCPU()-before)/float64(b.N), "cpu-ns/op")
	return nil
}

// threadCPU is the user and system time of the calling thread, in nanoseconds.
func threadCPU() int64 {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// makeLeaseTree makes what a small lease leaves: a few files and directories.
func makeLeaseTree(dir string) error {
	for _, d := range []string{"work/src/pkg", "work/.cache", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	for _, f := range []string{"work/main.go", "work/src/pkg/a.go", "work/src/pkg/b.go", "work/.cache/x", "tmp/t"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// The main goroutine keeps the main thread, so inMountNamespace's abandoned thread is never
// the main one (which the runtime would keep alive in the namespace).
func init() { runtime.LockOSThread() }

// inMountNamespace runs f on a thread of its own in a private mount namespace, with a
// tmpfs on scratch (so that disk writeback does not drown what is measured) holding n
// more bind mounts, all unmounted when f returns. The thread is never unlocked: it exits
// with its goroutine, and the namespace with it, so nothing of it reaches the test's own
// namespace even on a failure.
func inMountNamespace(b *testing.B, n int, f func(scratch string) error) {
	b.Helper()
	scratch := b.TempDir()
	done := make(chan error, 1)
	total := 0
	go func() {
		runtime.LockOSThread()
		done <- func() (err error) {
			if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
				return fmt.Errorf("unshare: %w", err)
			}
			if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
				return fmt.Errorf("make mounts private: %w", err)
			}
			if err := unix.Mount("tmpfs", scratch, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=64m"); err != nil {
				return fmt.Errorf("tmpfs: %w", err)
			}
			defer func() { err = errors.Join(err, unix.Unmount(scratch, 0)) }()
			src := filepath.Join(scratch, "mount-src")
			if err := os.Mkdir(src, 0o755); err != nil {
				return err
			}
			for i := range n {
				dst := filepath.Join(scratch, fmt.Sprintf("mount-%d", i))
				if err := os.Mkdir(dst, 0o755); err != nil {
					return err
				}
				if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
					return fmt.Errorf("bind mount: %w", err)
				}
				defer func() { err = errors.Join(err, unix.Unmount(dst, 0)) }()
			}
			// The namespace started as a copy of the host's: report what it holds in all.
			if table, err := os.ReadFile("/proc/thread-self/mountinfo"); err == nil {
				total = bytes.Count(table, []byte("\n"))
			}
			return f(scratch)
		}()
	}()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(total), "mounts")
}
