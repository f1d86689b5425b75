package sidecar

import (
	"os/exec"
	"strings"
	"testing"
)

// TestHandlerPackageImportsNoWiring keeps the HTTP package an HTTP package: the parts it
// serves are reached through the interfaces of server.go (it may name their types and
// errors); opening, restoring and sweeping them (lease/disk, the lease table's state,
// the daemon's steps) belong to package internal/daemon.
func TestHandlerPackageImportsNoWiring(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{join .Imports " "}}`, "github.com/sidecar-sandbox/sidecar/sidecar").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	imports := strings.Fields(string(out))
	if len(imports) < 10 {
		t.Fatalf("go list returned too few imports to be believed: %q", imports)
	}
	for _, imp := range imports {
		switch imp {
		case "github.com/sidecar-sandbox/sidecar/lease/disk", "github.com/sidecar-sandbox/sidecar/internal/daemon",
			"github.com/sidecar-sandbox/sidecar/internal/daemontest", "github.com/sidecar-sandbox/sidecar/systemd",
			"github.com/sidecar-sandbox/sidecar/tls/certgen":
			t.Errorf("package sidecar imports %s: wiring belongs in internal/daemon", imp)
		}
	}
}
