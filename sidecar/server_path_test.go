package sidecar

import (
	"net/http/httptest"
	"testing"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/sandbox"
)

// An absolute workdir path in a path route keeps its leading slash escaped, so that the
// router neither redirects it nor reads it as relative; nothing else is touched.
func TestKeepAbsolutePath(t *testing.T) {
	for in, want := range map[string]string{
		"/v1/leases/l1/files//workspace/a%20b.txt": "/v1/leases/l1/files/%2Fworkspace/a%20b.txt",
		"/v1/leases/l1/stat//workspace":            "/v1/leases/l1/stat/%2Fworkspace",
		"/v1/leases/l1/archive//etc":               "/v1/leases/l1/archive/%2Fetc", // refused by fsxfer, not redirected
		"/v1/leases/l1/files/a.txt":                "/v1/leases/l1/files/a.txt",
		"/v1/leases/l1/processes//x":               "/v1/leases/l1/processes//x",
		"/v1/leases//files//x":                     "/v1/leases//files//x",
		"/v1/info":                                 "/v1/info",
	} {
		r := httptest.NewRequest("GET", "https://sidecar"+in, nil)
		keepAbsolutePath(r)
		if got := r.URL.EscapedPath(); got != want {
			t.Errorf("%s → %s, want %s", in, got, want)
		}
	}
	if apitype.Workspace != sandbox.Workspace {
		t.Fatalf("apitype.Workspace %q and sandbox.Workspace %q differ: clients and leases would name the workdir differently", apitype.Workspace, sandbox.Workspace)
	}
}
