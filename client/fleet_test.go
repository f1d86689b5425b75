package client

import (
	"context"
	"encoding/pem"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

func TestFleetConfigFromEnv(t *testing.T) {
	env := func(kv ...string) func(string) (string, bool) {
		m := map[string]string{EnvProvider: ProviderRemote, EnvToken: strings.Repeat("t", 32)}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}
	cfg, err := configFromLookup(env(EnvURL, "https://10.0.0.1:7443, https://10.0.0.2:7443"))
	if err != nil || !isFleet(cfg) {
		t.Fatalf("a list: %v, fleet %v", err, isFleet(cfg))
	}
	cfg, err = configFromLookup(env(EnvURL, "https://sidecar.ns.svc:7443", EnvDiscovery, "dns"))
	if err != nil || cfg.Discovery != DiscoveryDNS || !isFleet(cfg) {
		t.Fatalf("dns: %v %+v", err, cfg)
	}
	if cfg, err := configFromLookup(env(EnvURL, "https://10.0.0.1:7443")); err != nil || isFleet(cfg) {
		t.Fatalf("one URL is not a fleet: %v %+v", err, cfg)
	}
	for _, tc := range []struct {
		kv   []string
		want string
	}{
		{[]string{EnvURL, "https://a:1,http://b:2"}, `scheme "http"`},
		{[]string{EnvURL, "https://a:1,,https://b:2"}, "empty entry"},
		{[]string{EnvURL, "https://a:1,https://b:2", EnvDiscovery, "dns"}, "takes one URL"},
		{[]string{EnvURL, "https://a:1", EnvDiscovery, "consul"}, EnvDiscovery},
	} {
		if _, err := configFromLookup(env(tc.kv...)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error saying %q", tc.kv, err, tc.want)
		}
	}
	if _, err := New(Config{URL: "https://a:1,https://a:1"}); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("a sidecar listed twice: %v", err)
	}
}

// DNS discovery: the name is resolved, each address is spoken to with the name as TLS
// server name (the real handshake verifies the certificate for it), and a drained
// sidecar is skipped for a new lease with the next choice taken.
func TestFleetDNSDiscovery(t *testing.T) {
	var mu sync.Mutex
	serverNames := map[string]bool{}
	h := func(draining bool) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			serverNames[r.TLS.ServerName] = true
			mu.Unlock()
			switch {
			case r.URL.Path == apitype.RouteInfo:
				writeJSON(w, 200, apitype.Info{Draining: draining, Limits: apitype.ServiceLimits{MaxLeases: 4}, Capacity: apitype.Capacity{FreeLeases: 4}})
			case r.URL.Path == apitype.RouteLeases && r.Method == http.MethodGet:
				writeJSON(w, 200, apitype.LeaseList{Leases: []apitype.Lease{}})
			case r.URL.Path == apitype.RouteLeases && draining:
				writeProblem(w, 503, apitype.CodeDraining, "draining")
			case r.URL.Path == apitype.RouteLeases:
				writeJSON(w, 201, apitype.Lease{ID: "l-" + r.Host, SessionID: "s", State: apitype.LeaseActive})
			default:
				writeProblem(w, 404, apitype.CodeNotFound, r.URL.Path)
			}
		}
	}
	// httptest's certificate names example.com (and 127.0.0.1): the name stands for the
	// Service, the servers for two of its pods.
	_, srvA := newTestClient(t, h(true))
	_, srvB := newTestClient(t, h(false))
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	var pems []byte
	for _, cert := range [][]byte{srvA.Certificate().Raw, srvB.Certificate().Raw} {
		pems = append(pems, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert})...)
	}
	if err := os.WriteFile(caFile, pems, 0o600); err != nil {
		t.Fatal(err)
	}
	var looked []string
	c, err := New(Config{URL: "https://example.com:7443", Discovery: DiscoveryDNS, Token: testToken, CAFile: caFile,
		LookupHost: func(ctx context.Context, host string) ([]string, error) {
			looked = append(looked, host)
			return []string{"127.0.0.1", "127.0.0.1"}, nil // duplicates are one sidecar
		}})
	if err != nil {
		t.Fatal(err)
	}
	// The name resolves to one address (duplicates are one sidecar), on the URL's port.
	members, err := c.fleet.current(context.Background())
	if err != nil || len(members) != 1 || members[0].url != "https://127.0.0.1:7443" || looked[0] != "example.com" {
		t.Fatalf("members %v err %v looked %v", members, err, looked)
	}
	// Two servers on ports of their own cannot come from one lookup (one port per name):
	// add them as current does for each address, with the name as TLS server name.
	c.fleet.members = nil
	for _, u := range []string{srvA.URL, srvB.URL} {
		if err := c.fleet.add(u, "example.com"); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range c.fleet.members {
		m.c.retry = fastRetry
	}
	l, err := c.Acquire(context.Background(), apitype.AcquireRequest{SessionID: "s"})
	if err != nil {
		t.Fatal(err)
	}
	l.StopRenewing()
	hostB := strings.TrimPrefix(srvB.URL, "https://")
	if l.ID() != "l-"+hostB {
		t.Fatalf("lease %s, want it on the sidecar not draining (%s)", l.ID(), hostB)
	}
	if !serverNames["example.com"] || len(serverNames) != 1 {
		t.Fatalf("TLS server names seen: %v, want example.com only", serverNames)
	}
	// Both draining: the error says so.
	c.fleet.members = c.fleet.members[:1]
	if _, err := c.Acquire(context.Background(), apitype.AcquireRequest{SessionID: "s2"}); !errors.Is(err, ErrDraining) {
		t.Fatalf("every sidecar draining: %v, want ErrDraining", err)
	}
	if _, err := New(Config{URL: "https://127.0.0.1:7443", Discovery: DiscoveryDNS}); err == nil {
		t.Fatal("DNS discovery of an address: no error")
	}
}
