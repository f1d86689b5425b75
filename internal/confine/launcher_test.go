package confine

import (
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sidecar-sandbox/sidecar/internal/confine/initproc"
)

// A launcher waiting for the cell to be quiet waits for a command noted meanwhile (Start
// notes its command before starting it): it is not made beside that command's plain start.
func TestAwaitQuietWaitsForANotedCommand(t *testing.T) {
	e := &Engine{}
	c := &cell{}
	l := &launcher{made: make(chan struct{}), cancel: make(chan struct{})}
	quiet := make(chan bool, 1)
	go func() { quiet <- e.awaitQuiet(c, l, nil) }() // as SetTemplate's refill does
	running := make(chan struct{})
	e.noteCommand(c, running) // before or after awaitQuiet looked: the same outcome
	// Quiet comes at launcherAfterReply without the note, not before the command has run
	// for launcherWhileRunning with it.
	select {
	case <-quiet:
		t.Fatal("the launcher would be made while the noted command starts")
	case <-time.After(launcherWhileRunning / 2):
	}
	close(running)
	select {
	case ok := <-quiet:
		if !ok {
			t.Fatal("awaitQuiet gave up without being canceled")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("awaitQuiet did not return after the command ended")
	}
}

// fakeLauncher is a launcher of cell c that says ready when the test writes
// initproc.LaunchReady to the returned end of its socket; made is left to the test.
func fakeLauncher(t *testing.T, e *Engine, c *cell) (*launcher, *os.File) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	l := &launcher{made: make(chan struct{}), cancel: make(chan struct{}), sock: os.NewFile(uintptr(fds[0]), "launch")}
	theirs := os.NewFile(uintptr(fds[1]), "launch")
	t.Cleanup(func() { l.sock.Close(); theirs.Close() })
	e.cells[c.id] = c
	c.launcher = l
	return l, theirs
}

// A command takes a launcher that is being forked once it is ready, rather than starting
// the plain way beside it; one that is not yet forked (waiting for quiet) is left alone.
func TestTakeLauncherCatchesUpWithOneBeingForked(t *testing.T) {
	e := &Engine{cells: map[string]*cell{}}
	c := &cell{id: "l"}
	l, theirs := fakeLauncher(t, e, c)

	if got := e.takeLauncher(c); got != nil || c.launcher != l {
		t.Fatalf("a launcher waiting for quiet was taken (%v) or dropped (%v)", got, c.launcher)
	}

	l.forking.Store(true)
	go func() {
		time.Sleep(launcherCatchUp / 5) // it finishes forking, then sets up, then says ready
		close(l.made)
		time.Sleep(launcherCatchUp / 5)
		_, _ = theirs.Write([]byte{initproc.LaunchReady})
	}()
	if got := e.takeLauncher(c); got != l {
		t.Fatalf("took %v, want the launcher that was being forked", got)
	}
	if c.launcher != nil {
		t.Fatal("the taken launcher is still the cell's")
	}
}

// A launcher that is made but not ready within launcherCatchUp stays for a later command.
func TestTakeLauncherLeavesOneNotReady(t *testing.T) {
	e := &Engine{cells: map[string]*cell{}}
	c := &cell{id: "l"}
	l, theirs := fakeLauncher(t, e, c)
	close(l.made)
	if got := e.takeLauncher(c); got != nil || c.launcher != l {
		t.Fatalf("a launcher not ready was taken (%v) or dropped (%v)", got, c.launcher)
	}
	_, _ = theirs.Write([]byte{initproc.LaunchReady})
	if got := e.takeLauncher(c); got != l {
		t.Fatalf("took %v once it was ready, want it", got)
	}
}
