package client

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDeps keeps daemon code out of every program that imports the client: an app must
// not link cgroups, pty, QuickJS, JWT or Prometheus because it talks to a sandbox.
func TestDeps(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/sidecar-sandbox/sidecar/client").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	forbidden := []string{
		"github.com/sidecar-sandbox/sidecar/sidecar",
		"github.com/sidecar-sandbox/sidecar/lease",
		"github.com/sidecar-sandbox/sidecar/fsxfer",
		"github.com/containerd/cgroups",
		"github.com/creack/pty",
		"github.com/fastschema/qjs",
		"github.com/golang-jwt",
		"github.com/prometheus",
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list returned too few packages to be believed: %q", deps)
	}
	for _, dep := range deps {
		for _, bad := range forbidden {
			if dep == bad || strings.HasPrefix(dep, bad+"/") {
				t.Errorf("client depends on %s", dep)
			}
		}
	}
}
