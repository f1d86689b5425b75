package daemon_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// providerEnv points the SANDBOX_* variables at d; provider "" leaves SANDBOX_PROVIDER unset.
func (d *testDaemon) providerEnv(t *testing.T, provider string) *client.Provider {
	t.Helper()
	t.Setenv(client.EnvProvider, provider) // also restores it after the test
	if provider == "" {
		_ = os.Unsetenv(client.EnvProvider)
	}
	t.Setenv(client.EnvURL, d.url)
	t.Setenv(client.EnvToken, testToken)
	t.Setenv(client.EnvCAFile, d.caFile)
	p, err := client.ProviderFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestProviderLifecycle(t *testing.T) {
	d := startDaemon(t)
	ctx := context.Background()
	p := d.providerEnv(t, "remote")
	defer p.Close()

	l := must(p.Sandbox(ctx, apitype.AcquireRequest{SessionID: "chat-1"}))(t)
	if err := p.WriteFile(ctx, "chat-1", "notes.txt", []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	res := must(p.Exec(ctx, "chat-1", apitype.ExecRequest{Argv: []string{"cat", "notes.txt"}}))(t)
	if res.Stdout != "hello" || res.ExitCode != 0 {
		t.Fatalf("exec: %+v", res)
	}
	if b := must(p.ReadFile(ctx, "chat-1", "notes.txt"))(t); string(b) != "hello" {
		t.Fatalf("read %q", b)
	}
	// A second Provider (another worker process) reconnects to the same sandbox.
	other := d.providerEnv(t, "remote")
	defer other.Close()
	if l2 := must(other.Sandbox(ctx, apitype.AcquireRequest{SessionID: "chat-1"}))(t); l2.ID() != l.ID() {
		t.Fatalf("reconnect got lease %s, want %s", l2.ID(), l.ID())
	}
	// Release by session id, from the Provider that did not create it.
	if err := other.Release(ctx, "chat-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.client.Get(ctx, l.ID()); !client.IsNotFound(err) {
		t.Fatalf("after release: %v, want not found", err)
	}
	if err := p.Release(ctx, "chat-1"); !errors.Is(err, client.ErrLeaseNotFound) {
		t.Fatalf("second release: %v, want ErrLeaseNotFound", err)
	}
	// The handle whose lease was released behind its back is replaced on the next use.
	res = must(p.Exec(ctx, "chat-1", apitype.ExecRequest{Argv: []string{"ls"}}))(t)
	if res.ExitCode != 0 || res.Stdout != "" {
		t.Fatalf("exec in a fresh sandbox: %+v", res)
	}
	if err := p.Release(ctx, "chat-1"); err != nil {
		t.Fatal(err)
	}
}

// With SANDBOX_PROVIDER unset every sandbox operation fails with ErrCapability, while
// cleanup and release of leases made earlier keep working.
func TestProviderDisabledStillCleansUp(t *testing.T) {
	d := startDaemon(t)
	ctx := context.Background()
	kept := d.acquireOnce(apitype.AcquireRequest{SessionID: "made-earlier"})
	expiring := d.acquireOnce(apitype.AcquireRequest{SessionID: "expiring", TTLSeconds: 5})

	p := d.providerEnv(t, "")
	if p.Enabled() {
		t.Fatal("enabled without SANDBOX_PROVIDER")
	}
	_, e1 := p.Sandbox(ctx, apitype.AcquireRequest{SessionID: "made-earlier"})
	_, e2 := p.Exec(ctx, "made-earlier", apitype.ExecRequest{Argv: []string{"true"}})
	e3 := p.WriteFile(ctx, "made-earlier", "f", []byte("x"), 0o644)
	_, e4 := p.ReadFile(ctx, "made-earlier", "f")
	_, e5 := p.RunScript(ctx, apitype.ScriptRequest{Source: "1"})
	for i, err := range []error{e1, e2, e3, e4, e5} {
		if !errors.Is(err, client.ErrCapability) || !strings.Contains(err.Error(), client.EnvProvider) {
			t.Errorf("operation %d: %v, want ErrCapability naming %s", i+1, err, client.EnvProvider)
		}
	}

	d.clock.Advance(10 * time.Second)
	res := must(p.Cleanup(ctx))(t)
	if len(res.Leases) != 1 || res.Leases[0] != expiring.ID() {
		t.Fatalf("cleanup reaped %v, want [%s]", res.Leases, expiring.ID())
	}
	if err := p.Release(ctx, "made-earlier"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.client.Get(ctx, kept.ID()); !client.IsNotFound(err) {
		t.Fatalf("after release: %v", err)
	}
}
