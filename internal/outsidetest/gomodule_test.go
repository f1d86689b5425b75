package outsidetest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Another module uses the Go client as the README shows: the module path, the two import
// paths, ProviderFromEnv and apitype.ExecRequest. The module is taken from this checkout
// (go mod edit -replace, as for any copy not on a module proxy); its dependencies come from
// the module cache or the Go module proxy.
func TestGoClientFromAnotherModule(t *testing.T) {
	checkout, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	app := t.TempDir()
	files := map[string]string{
		"go.mod": "module example.com/app\n\ngo 1.26\n\nrequire github.com/sidecar-sandbox/sidecar v0.0.0\n\nreplace github.com/sidecar-sandbox/sidecar => " + checkout + "\n",
		"main.go": `package main

import (
	"context"
	"fmt"
	"os"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

func main() {
	p, err := client.ProviderFromEnv()
	if err != nil {
		fmt.Println(err)
		os.Exit(3)
	}
	res, err := p.Exec(context.Background(), "s1", apitype.ExecRequest{Argv: []string{"true"}})
	fmt.Println(res.ExitCode, err)
}
`,
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(app, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	goCmd := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("go", args...)
		cmd.Dir = app
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	goCmd("mod", "tidy")
	goCmd("build", "-o", "app", ".")
	cmd := exec.Command(filepath.Join(app, "app"))
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")} // no SANDBOX_* settings
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "set SANDBOX_PROVIDER=remote") {
		t.Fatalf("the app without settings: %v\n%s\nwant the client's word that sandboxes are off, naming SANDBOX_PROVIDER", err, out)
	}
}
