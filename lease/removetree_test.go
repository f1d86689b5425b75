package lease

import (
	"bufio"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sidecar-sandbox/sidecar/fsxfer"
)

// The default remover, fsxfer.RemoveTree: a release removes the whole tree, and a symlink
// the lease planted pointing out of it costs nothing outside.
func TestReleaseWithRemoveTree(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.RemoveDir = nil })
	m := e.open()
	outside := filepath.Join(t.TempDir(), "precious")
	if err := os.WriteFile(outside, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	l := mustAcquire(t, m, Request{SessionID: "s"})
	deep := filepath.Join(l.Workdir(), "a", "b")
	if err := os.MkdirAll(deep, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Dir(outside), filepath.Join(deep, "escape")); err != nil {
		t.Fatal(err)
	}
	if err := m.Release(context.Background(), l.ID); err != nil {
		t.Fatal(err)
	}
	m.WaitRetired()
	assertGone(t, l.Dir)
	if data, err := os.ReadFile(outside); err != nil || string(data) != "keep" {
		t.Errorf("file behind the symlink: %q, %v", data, err)
	}
}

// A mount inside a lease (left by a crashed sandbox, say) keeps the lease's directory,
// never removes what lies in the mount, and is tried again later.
func TestReleaseRefusesMountPoint(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a tmpfs inside a lease directory")
	}
	e := newEnv(t, func(c *Config) { c.RemoveDir = nil })
	m := e.open()
	l := mustAcquire(t, m, Request{SessionID: "s"})
	mnt := filepath.Join(l.Workdir(), "mnt-"+t.Name())
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", mnt, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=1m"); err != nil {
		t.Skipf("cannot mount tmpfs here: %v", err)
	}
	// Runs before the temp dirs are removed (cleanups run last-in first-out).
	t.Cleanup(func() {
		if mounted(t, mnt) {
			if err := unix.Unmount(mnt, 0); err != nil {
				t.Errorf("unmount %s: %v", mnt, err)
			}
		}
	})
	inMount := filepath.Join(mnt, "data")
	if err := os.WriteFile(inMount, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}

	if err := m.Release(context.Background(), l.ID); err != nil {
		t.Fatal(err)
	}
	m.WaitRetired()
	if _, err := os.Stat(inMount); err != nil {
		t.Errorf("a file inside the mount is gone: %v", err)
	}
	if !m.Owns(l.ID) {
		t.Error("the released lease's directory is no longer owned: Orphans would take it")
	}
	m.mu.RLock()
	err := m.retiring[l.ID].err
	m.mu.RUnlock()
	if !errors.Is(err, fsxfer.ErrMountPoint) {
		t.Errorf("the removal failed with %v, want ErrMountPoint", err)
	}

	if err := unix.Unmount(mnt, 0); err != nil {
		t.Fatal(err)
	}
	m.retryRetires()
	m.WaitRetired()
	assertGone(t, l.Dir)
	if m.Owns(l.ID) {
		t.Error("the lease id is still owned once its directory is gone")
	}
}

func mounted(t *testing.T, path string) bool {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) > 4 && fields[4] == path {
			return true
		}
	}
	return false
}
