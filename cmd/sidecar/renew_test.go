package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// leaseKeeper.ended tells an expired lease from a released one, also once the daemon has
// reaped it (404) and only the expiry the keeper knew is left to go by.
func TestLeaseKeeperSaysWhyTheLeaseEnded(t *testing.T) {
	var status int
	var body any
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if status >= 400 {
			w.Header().Set("Content-Type", apitype.ProblemContentType)
		}
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(body)
	}))
	defer srv.Close()
	c, err := client.New(client.Config{URL: srv.URL, Token: strings.Repeat("t", 40), HTTPClient: srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	past, future := time.Now().Add(-time.Minute), time.Now().Add(time.Hour)
	notFound := apitype.Problem{Status: 404, Code: apitype.CodeLeaseNotFound, Title: "Not Found"}
	for _, tt := range []struct {
		name    string
		status  int
		body    any
		expires time.Time
		want    string
	}{
		{"active", 200, apitype.Lease{ID: "L1", State: apitype.LeaseActive, ExpiresAt: future}, future, ""},
		{"expired, not reaped yet", 200, apitype.Lease{ID: "L1", State: apitype.LeaseExpired, ExpiresAt: past}, past, "lease L1 expired at"},
		{"reaped after its expiry", 404, notFound, past, "lease L1 expired at"},
		{"gone before its expiry", 404, notFound, future, "lease L1 was released"},
		{"410", 410, apitype.Problem{Status: 410, Code: apitype.CodeLeaseExpired, Title: "Gone"}, future, "lease L1 expired"},
	} {
		status, body = tt.status, tt.body
		k := &leaseKeeper{l: c.OpenLease("L1", ""), expires: tt.expires}
		if got := k.ended(t.Context()); (tt.want == "" && got != "") || !strings.HasPrefix(got, tt.want) {
			t.Errorf("%s: %q, want %q", tt.name, got, tt.want)
		}
	}
}
