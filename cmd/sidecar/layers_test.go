package main

import (
	"os/exec"
	"strings"
	"testing"
)

// layers are the module's folders from the top down, as the README's layout draws them:
// a package may import its own layer's packages other than its ancestors, and any layer
// below its own, never one above. Folders in no layer (the client, the wire types, TLS,
// systemd, docs, test tools) are libraries that import no layered package.
var layers = [][]string{
	{"cmd/"},
	{"internal/daemon", "internal/daemontest", "internal/nettest"},
	{"sidecar"},
	{"lease", "internal/process", "internal/shell", "internal/script"},
	{"internal/sandbox"},
	{"fsxfer", "internal/confine"},
	{"internal/kernel/"},
}

const module = "github.com/sidecar-sandbox/sidecar/"

// layerOf is the index in layers of the package at rel (a path under the module), or -1.
func layerOf(rel string) int {
	for i, prefixes := range layers {
		for _, p := range prefixes {
			if rel == strings.TrimSuffix(p, "/") || strings.HasPrefix(rel, strings.TrimSuffix(p, "/")+"/") {
				return i
			}
		}
	}
	return -1
}

func TestPackagesImportDownTheLayers(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "../../...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) < 25 {
		t.Fatalf("go list listed %d packages, too few to be believed", len(lines))
	}
	for _, line := range lines {
		fields := strings.Fields(line)
		pkg := strings.TrimPrefix(fields[0], module)
		for _, imp := range fields[1:] {
			if !strings.HasPrefix(imp, module) {
				continue
			}
			dep := strings.TrimPrefix(imp, module)
			if strings.HasPrefix(pkg, dep+"/") {
				t.Errorf("%s imports %s, its own parent folder", pkg, dep)
			}
			from, to := layerOf(pkg), layerOf(dep)
			switch {
			case to >= 0 && from < 0:
				t.Errorf("%s, a library in no layer, imports %s (layer %d)", pkg, dep, to)
			case to >= 0 && to < from:
				t.Errorf("%s (layer %d) imports %s, a layer above it (%d)", pkg, from, dep, to)
			}
		}
	}
}
