package charttest

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
	appsv1 "k8s.io/api/apps/v1"
)

// The image the chart runs is the one `make image` builds.
func TestChartImageIsMakeImage(t *testing.T) {
	out, err := exec.Command("make", "-s", "-C", "../..", "image-name").Output()
	if err != nil {
		t.Fatalf("make image-name: %v", err)
	}
	docs, err := render(t, base)
	if err != nil {
		t.Fatal(err)
	}
	var s appsv1.StatefulSet
	strict(t, "statefulset", docs["sidecar/templates/statefulset.yaml"], &s)
	if got, want := s.Spec.Template.Spec.Containers[0].Image, strings.TrimSpace(string(out)); got != want {
		t.Fatalf("the chart runs %q, make image builds %q", got, want)
	}
}

// .dockerignore, read with the matcher docker and podman use, keeps what is large, local
// or secret out of the build context and leaves in what the build needs.
func TestDockerignore(t *testing.T) {
	f, err := os.Open("../../.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	patterns, err := ignorefile.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	pm, err := patternmatcher.New(patterns)
	if err != nil {
		t.Fatal(err)
	}
	excluded := func(path string) bool {
		// A path is out when it or a parent directory matches (the context walk
		// skips an excluded directory whole).
		out, err := pm.MatchesOrParentMatches(path)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	for _, p := range []string{".git/config", "bin/sidecar", "bin/sidecar-init", "sidecar/console/web/node_modules/x/index.js",
		"client/ts/node_modules/x/index.js", ".cache/vm/initramfs.cpio.gz", ".state/auth-token", ".state/tls/tls-self-signed.key", "sidecar/sidecar.test"} {
		if !excluded(p) {
			t.Errorf("%s is in the build context", p)
		}
	}
	for _, p := range []string{"go.mod", "go.sum", "Makefile", "cmd/sidecar/main.go", "cmd/sidecar-init/sidecar-init.c",
		"sidecar/console/dist/index.html", "deploy/Containerfile"} {
		if excluded(p) {
			t.Errorf("%s, which the build needs, is left out of the build context", p)
		}
	}
}
