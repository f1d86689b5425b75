package sandbox

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"
)

// A lease that opens PTYs until it cannot gets its own instance's max and no more; another
// lease still starts a TTY command, and the host still opens a PTY.
func TestPTYHog(t *testing.T) {
	needPython(t)
	const max = 8
	for _, h := range testHelpers {
		t.Run(h.name, func(t *testing.T) {
			s := newTestSandboxConfig(t, Config{HelperPath: h.usable(t), MaxPTYs: max})
			a := newTestLease(t, s, nil)
			b := newTestLease(t, s, nil)

			hog, tr, err := s.Command(a.ID, Spec{Argv: []string{"/usr/bin/python3", "-c", `
import os, sys
fds = []
try:
    while True:
        fds.append(os.openpty())
except OSError as e:
    print(len(fds), e.strerror, flush=True)
sys.stdin.read()`}})
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			stdin, err := hog.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			stdout, err := hog.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := tr.Start(); err != nil {
				t.Fatal(err)
			}
			defer hog.Wait()
			defer stdin.Close()
			line, err := bufio.NewReader(stdout).ReadString('\n')
			if err != nil {
				t.Fatalf("hog: %v", err)
			}
			if n, _, _ := strings.Cut(line, " "); n != strconv.Itoa(max) {
				t.Fatalf("lease A opened %q PTYs, want its max %d", line, max)
			}
			// A's own instance is full: its next TTY command cannot start...
			if m, sl, err := s.OpenPTY(a.ID); err == nil {
				m.Close()
				sl.Close()
				t.Error("OpenPTY in the full lease A succeeded")
			} else if !errors.Is(err, ErrLimit) {
				t.Errorf("OpenPTY in the full lease A: %v, want ErrLimit (429 lease_limit)", err)
			}
			// ...while B's is untouched, and so are the host's PTYs.
			cmd, btr, err := s.Command(b.ID, Spec{Argv: []string{"/bin/sh", "-c", `tty && python3 -c 'import os; os.openpty(); print("openpty ok")'`}, TTY: true})
			if err != nil {
				t.Fatal(err)
			}
			defer btr.Close()
			if got := runTTY(t, s, b.ID, cmd, btr); !strings.Contains(got, "/dev/pts/0") || !strings.Contains(got, "openpty ok") {
				t.Errorf("lease B's TTY command during A's hog: %q", got)
			}
			m, sl, err := pty.Open()
			if err != nil {
				t.Fatalf("host PTY during lease A's hog: %v", err)
			}
			m.Close()
			sl.Close()
		})
	}
}

// Instances stacked on one directory (a daemon killed between two mounts) are found and
// all unmounted by the sweep, in a mount namespace of the test's own.
func TestSweepPTSUnmountsStackedInstances(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts devpts")
	}
	root := t.TempDir()
	dir := filepath.Join(root, "lease")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		// The thread ends with the goroutine (never unlocked): its namespace goes with it.
		runtime.LockOSThread()
		errc <- func() error {
			if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
				return err
			}
			if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
				return err
			}
			if m, err := devptsAt(dir); err != nil || m {
				return fmt.Errorf("before any mount: mounted %v, %v", m, err)
			}
			for range 2 {
				if err := unix.Mount("devpts", dir, "devpts", 0, "newinstance"); err != nil {
					return err
				}
			}
			if m, err := devptsAt(dir); err != nil || !m {
				return fmt.Errorf("two instances mounted: mounted %v, %v", m, err)
			}
			if err := sweepPTS(root); err != nil {
				return err
			}
			if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("after the sweep the directory is still there: %v", err)
			}
			return nil
		}()
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}
