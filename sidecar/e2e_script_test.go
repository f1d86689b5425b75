package sidecar_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/sidecar/daemon"
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
