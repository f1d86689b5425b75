package cgroupfs

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// A memory limit written while signals keep arriving is written, not refused: v1's
// memory controller answers EINTR to a write made with a signal pending, as the daemon's
// writes often are (a SIGCHLD per helper that exits). Without the retry this fails within
// the loop on this host's v1 hierarchy.
func TestWriteFileWhileSignalled(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("cgroups need root")
	}
	if Version() != 1 {
		t.Skip("the EINTR is v1's memory controller's; CI's host is v1 and runs this")
	}
	dir := filepath.Join(Root, "memory", "sidecar-test-cgroupfs-"+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Rmdir(dir) })
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
				syscall.Kill(os.Getpid(), syscall.SIGCHLD)
			}
		}
	}()
	defer func() { close(stop); <-done }()
	deadline := time.Now().Add(time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		limit := strconv.Itoa((64 + i%2) << 20)
		if err := WriteFile(filepath.Join(dir, "memory.limit_in_bytes"), limit); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
}
