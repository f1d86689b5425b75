package client

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

func lookupIn(env map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := env[k]; return v, ok }
}

// Disabled sandboxes refuse every sandbox operation with ErrCapability naming the
// setting, and never touch the network (there is no daemon behind this URL).
func TestProviderDisabled(t *testing.T) {
	for _, provider := range []string{"", "local"} {
		env := map[string]string{EnvURL: "https://127.0.0.1:1", EnvToken: testToken}
		if provider != "" {
			env[EnvProvider] = provider
		}
		p, err := providerFromLookup(lookupIn(env))
		if err != nil {
			t.Fatal(err)
		}
		if p.Enabled() || p.Client() == nil {
			t.Fatalf("provider %q: enabled %v, client %v", provider, p.Enabled(), p.Client())
		}
		ctx := context.Background()
		_, e1 := p.Sandbox(ctx, apitype.AcquireRequest{SessionID: "s"})
		_, e2 := p.Exec(ctx, "s", apitype.ExecRequest{Argv: []string{"true"}})
		e3 := p.WriteFile(ctx, "s", "f", nil, 0o644)
		_, e4 := p.ReadFile(ctx, "s", "f")
		e5 := p.UploadDir(ctx, "s", t.TempDir(), "d")
		e6 := p.DownloadDir(ctx, "s", "d", t.TempDir())
		_, e7 := p.RunScript(ctx, apitype.ScriptRequest{Source: "1"})
		for i, err := range []error{e1, e2, e3, e4, e5, e6, e7} {
			if !errors.Is(err, ErrCapability) || !strings.Contains(err.Error(), EnvProvider) {
				t.Errorf("provider %q, operation %d: %v, want ErrCapability naming %s", provider, i+1, err, EnvProvider)
			}
		}
	}
}

// With sandboxes disabled a missing URL is no error until cleanup needs one.
func TestProviderDisabledWithoutRemote(t *testing.T) {
	p, err := providerFromLookup(lookupIn(nil))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Cleanup(context.Background()); err == nil || !strings.Contains(err.Error(), EnvURL) {
		t.Fatalf("cleanup without a URL: %v", err)
	}
	if err := p.Release(context.Background(), "s"); err == nil || !strings.Contains(err.Error(), EnvURL) {
		t.Fatalf("release without a URL: %v", err)
	}
	// Enabled, the same configuration is an error at once.
	if _, err := providerFromLookup(lookupIn(map[string]string{EnvProvider: "remote"})); err == nil || !strings.Contains(err.Error(), EnvURL) {
		t.Fatalf("enabled without a URL: %v", err)
	}
	if _, err := providerFromLookup(lookupIn(map[string]string{EnvScriptEnabled: "maybe"})); err == nil || !strings.Contains(err.Error(), EnvScriptEnabled) {
		t.Fatalf("SCRIPT_ENABLED=maybe: %v", err)
	}
}

// SCRIPT_ENABLED=false fails scripts without a round trip; the rest still works.
func TestProviderScriptsDisabled(t *testing.T) {
	var requests atomic.Int64
	_, srv := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		writeJSON(w, http.StatusOK, apitype.ScriptResult{})
	}))
	p, err := providerFromLookup(lookupIn(map[string]string{EnvProvider: "remote", EnvURL: srv.URL, EnvToken: testToken, EnvScriptEnabled: "false"}))
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.RunScript(context.Background(), apitype.ScriptRequest{Source: "1"})
	if !errors.Is(err, ErrCapability) || !strings.Contains(err.Error(), EnvScriptEnabled) {
		t.Fatalf("RunScript: %v, want ErrCapability naming %s", err, EnvScriptEnabled)
	}
	if n := requests.Load(); n != 0 {
		t.Fatalf("%d requests sent for a disabled script", n)
	}
}
