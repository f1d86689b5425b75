package sandbox

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/sidecar-sandbox/sidecar/sidecar/process"
)

// BenchmarkExec compares a lease command through the helper (child cgroup, namespaces,
// uid, Landlock) with a plain fork/exec, in one run: read the ratio, not the times.
func BenchmarkExec(b *testing.B) {
	b.Run("local", func(b *testing.B) {
		for b.Loop() {
			if err := exec.Command("/bin/true").Run(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("sandbox", func(b *testing.B) { benchSandbox(b, "") })
	// The helper as its own small binary (sidecar-init), as deployed next to the daemon.
	b.Run("sandbox-tiny-helper", func(b *testing.B) {
		helper := filepath.Join(b.TempDir(), "sidecar-init")
		if out, err := exec.Command("go", "build", "-o", helper, "../../cmd/sidecar-init").CombinedOutput(); err != nil {
			b.Skipf("cannot build sidecar-init: %v\n%s", err, out)
		}
		benchSandbox(b, helper)
	})
}

func benchSandbox(b *testing.B, helper string) {
	s := newTestSandbox(b)
	if helper != "" {
		s.helper = helper
	}
	l := newTestLease(b, s, nil)
	{
		for b.Loop() {
			cmd, tr, err := s.Command(l.ID, process.Spec{Argv: []string{"/bin/true"}})
			if err != nil {
				b.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			if err := tr.(*tree).Started(context.Background()); err != nil {
				b.Fatal(err)
			}
			if err := cmd.Wait(); err != nil {
				b.Fatal(err)
			}
			if err := tr.Close(); err != nil {
				b.Fatal(err)
			}
		}
	}
}
