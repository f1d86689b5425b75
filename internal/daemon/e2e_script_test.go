package daemon_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/daemon"
	"github.com/sidecar-sandbox/sidecar/internal/daemontest"
)

func TestScripts(t *testing.T) {
	d := startDaemon(t, func(c *daemon.Config) { c.ScriptEnabled = true; c.ScriptWorkers = 1 })
	ctx := context.Background()
	l := d.acquire("scripts")

	res := must(d.client.RunScript(ctx, apitype.ScriptRequest{
		Source: `function transform(input) { console.log("n=" + input.n); return {doubled: input.n * 2, tags: input.tags.map(s => s.toUpperCase())} }`,
		Input:  map[string]any{"n": 21, "tags": []string{"a", "b"}},
	}))(t)
	got, _ := json.Marshal(res.Result)
	if string(got) != `{"doubled":42,"tags":["A","B"]}` || len(res.Logs) != 1 || res.Logs[0] != "n=21" {
		t.Fatalf("result %s logs %q", got, res.Logs)
	}
	// Any lease token may run scripts.
	if _, err := d.newClient(l.Token()).RunScript(ctx, apitype.ScriptRequest{Source: `function transform(i){return i}`, Input: 1}); err != nil {
		t.Fatalf("script with a lease token: %v", err)
	}

	_, err := d.client.RunScript(ctx, apitype.ScriptRequest{Source: "function transform(input) {\n  return input.(;\n}"})
	var apiErr *client.APIError
	if !errors.Is(err, client.ErrScript) || !errors.As(err, &apiErr) || apiErr.Line == 0 {
		t.Fatalf("syntax error: %v (%+v)", err, apiErr)
	}
	_, err = d.client.RunScript(ctx, apitype.ScriptRequest{Source: `function transform() { while (true) {} }`, TimeoutMS: 200})
	if !errors.Is(err, client.ErrScriptTimeout) {
		t.Fatalf("endless loop: %v, want ErrScriptTimeout", err)
	}
	// The next script runs normally.
	res = must(d.client.RunScript(ctx, apitype.ScriptRequest{Source: `function transform(i) { return i + 1 }`, Input: 1}))(t)
	if v, _ := json.Marshal(res.Result); string(v) != "2" {
		t.Fatalf("after a timeout: %s", v)
	}
	_, err = d.client.RunScript(ctx, apitype.ScriptRequest{Source: `function transform() { return std.loadFile("/etc/passwd") }`})
	if !errors.Is(err, client.ErrScript) {
		t.Fatalf("std.loadFile: %v, want a script error", err)
	}
	if os.Geteuid() == 0 {
		t.Run("kernel memory limit", func(t *testing.T) { testScriptKernelMemoryLimit(t, d) })
	}
}

// testScriptKernelMemoryLimit checks that the worker runs in its own cgroup in the
// script cell under the daemon's cgroup parent (v1 and v2), and that the kernel enforces
// its memory limit: lowered below what QuickJS's own limit and the daemon's watchdog
// allow, a script allocating past it is killed by the kernel and reported as such.
func testScriptKernelMemoryLimit(t *testing.T, d *testDaemon) {
	ctx := context.Background()
	var dir string
	waitFor(t, "one live worker cgroup under the parent", 30*time.Second, func() bool {
		var live []string
		for _, p := range daemontest.CgroupParents(d.cfg.CgroupParent) {
			ws, _ := filepath.Glob(filepath.Join(p, "_scripts", "w*"))
			for _, w := range ws {
				_, v1 := os.Stat(filepath.Join(w, "memory.limit_in_bytes"))
				_, v2 := os.Stat(filepath.Join(w, "memory.max"))
				procs, _ := os.ReadFile(filepath.Join(w, "cgroup.procs"))
				if (v1 == nil || v2 == nil) && len(strings.TrimSpace(string(procs))) > 0 {
					live = append(live, w)
				}
			}
		}
		if len(live) == 1 {
			dir = live[0]
		}
		return len(live) == 1
	})
	usage, limitFile := "memory.current", "memory.max"
	if _, err := os.Stat(filepath.Join(dir, limitFile)); err != nil {
		usage, limitFile = "memory.usage_in_bytes", "memory.limit_in_bytes"
	}
	b, err := os.ReadFile(filepath.Join(dir, usage))
	if err != nil {
		t.Fatal(err)
	}
	used, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	// The script asks for the default memory, as the worker's last job did, so the daemon
	// keeps the lowered limit; QuickJS's own limit (64 MiB) is above the headroom left.
	if err := os.WriteFile(filepath.Join(dir, limitFile), []byte(strconv.FormatInt(used+24<<20, 10)), 0); err != nil {
		t.Fatal(err)
	}
	_, err = d.client.RunScript(ctx, apitype.ScriptRequest{
		Source:    `function transform() { const a = []; for (;;) a.push(new Uint8Array(1 << 20).fill(1)) }`,
		TimeoutMS: 20000,
	})
	var apiErr *client.APIError
	if !errors.Is(err, client.ErrScript) || !errors.As(err, &apiErr) || !strings.Contains(apiErr.Detail, "the kernel killed its worker") {
		t.Fatalf("allocating past the worker's cgroup limit: %v, want a script error saying the kernel killed it", err)
	}
	res := must(d.client.RunScript(ctx, apitype.ScriptRequest{Source: `function transform(i) { return i + 1 }`, Input: 1}))(t)
	if v, _ := json.Marshal(res.Result); string(v) != "2" {
		t.Fatalf("after the kill: %s", v)
	}
}

func TestScriptsDisabled(t *testing.T) {
	d := startDaemon(t) // ScriptEnabled false
	_, err := d.client.RunScript(context.Background(), apitype.ScriptRequest{Source: `function transform(i){return i}`})
	if !errors.Is(err, client.ErrCapability) {
		t.Fatalf("disabled scripts: %v, want ErrCapability", err)
	}
	status, hdr, body := d.raw("POST", "/v1/scripts/run", testToken, jsonBody(map[string]any{"source": "function transform(i){return i}"}), nil)
	wantProblem(t, status, hdr, body, 404, apitype.CodeCapabilityDisabled)
	if info := must(d.client.Info(context.Background()))(t); info.Capabilities.Scripts {
		t.Fatal("info says scripts are enabled")
	}
}
