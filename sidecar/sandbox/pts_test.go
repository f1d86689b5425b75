package sandbox

import (
	"bufio"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/creack/pty"
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
			if err := hog.Start(); err != nil {
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
