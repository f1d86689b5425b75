package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/gorilla/websocket"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// SetNetwork puts the policy object on the lease's network route with the handle's
// credential and keeps the lease it gets back.
func TestSetNetworkSendsPolicy(t *testing.T) {
	policy := apitype.NetworkPolicy{Egress: apitype.EgressAllowlist, AllowOut: []string{"pypi.org:443", "10.1.2.0/24"}}
	c, _ := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPut || r.URL.Path != "/v1/leases/L1/network" {
			writeProblem(w, http.StatusNotFound, "not_found", r.Method+" "+r.URL.Path)
			return
		}
		requireAuth(t, r, testToken)
		var got apitype.NetworkPolicy
		if err := json.NewDecoder(r.Body).Decode(&got); err != nil {
			t.Errorf("body: %v", err)
		}
		writeJSON(w, http.StatusOK, apitype.Lease{ID: "L1", Network: got,
			NetworkStats: &apitype.NetworkStats{BytesSent: 5, ConnectionsDenied: 2}})
	}))
	l, err := c.SetNetwork(context.Background(), "L1", policy)
	if err != nil {
		t.Fatal(err)
	}
	if l.Network.Egress != apitype.EgressAllowlist || strings.Join(l.Network.AllowOut, ",") != "pypi.org:443,10.1.2.0/24" {
		t.Errorf("lease network %+v, want %+v", l.Network, policy)
	}
	if l.NetworkStats == nil || l.NetworkStats.BytesSent != 5 || l.NetworkStats.ConnectionsDenied != 2 {
		t.Errorf("network_stats %+v", l.NetworkStats)
	}
}

// The lease's network still decodes from the string form an older daemon sends.
func TestLeaseNetworkStringForm(t *testing.T) {
	var l apitype.Lease
	if err := json.Unmarshal([]byte(`{"id":"L1","network":"none"}`), &l); err != nil {
		t.Fatal(err)
	}
	if l.Network.Egress != apitype.EgressNone || l.NetworkStats != nil {
		t.Errorf("got %+v, stats %v", l.Network, l.NetworkStats)
	}
}

// portEcho upgrades the port-forward route and echoes every binary message.
func portEcho(t *testing.T, token string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/leases/L1/port-forward/9" {
			writeProblem(w, http.StatusBadGateway, apitype.CodePortUnreachable, "nothing listens on port 9 in the lease")
			return
		}
		if r.URL.Path != "/v1/leases/L1/port-forward/7000" {
			writeProblem(w, http.StatusNotFound, "not_found", r.URL.Path)
			return
		}
		if !requireAuth(t, r, token) {
			return
		}
		up := websocket.Upgrader{Subprotocols: []string{apitype.PortForwardProtocol}}
		conn, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer conn.Close()
		for {
			typ, msg, err := conn.ReadMessage()
			if err != nil {
				return
			}
			if typ != websocket.BinaryMessage {
				t.Errorf("message type %d, want binary", typ)
			}
			if bytes.Equal(msg, []byte("bye")) {
				_ = conn.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""))
				return
			}
			if err := conn.WriteMessage(websocket.BinaryMessage, msg); err != nil {
				return
			}
		}
	})
}

// DialPort carries bytes both ways in binary messages (a write larger than one frame
// included) and reads the daemon's close as io.EOF.
func TestDialPortEcho(t *testing.T) {
	c, _ := newTestClient(t, portEcho(t, "lease-token"))
	conn, err := c.OpenLease("L1", "lease-token").DialPort(context.Background(), 7000)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	big := bytes.Repeat([]byte("0123456789abcdef"), 3*maxPortFrame/16+7)
	if _, err := conn.Write(big); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(big))
	if _, err := io.ReadFull(conn, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, big) {
		t.Fatal("echo differs from what was sent")
	}
	if _, err := conn.Write([]byte("bye")); err != nil {
		t.Fatal(err)
	}
	if n, err := conn.Read(got); n != 0 || err != io.EOF {
		t.Fatalf("after the daemon closed: %d, %v; want 0, io.EOF", n, err)
	}
	if _, err := conn.Read(got); err != io.EOF {
		t.Fatalf("second read after the end: %v, want io.EOF", err)
	}
}

// A refused upgrade is the daemon's problem as an *APIError; a bad port never leaves.
func TestDialPortErrors(t *testing.T) {
	c, _ := newTestClient(t, portEcho(t, testToken))
	l := c.OpenLease("L1", "")
	_, err := l.DialPort(context.Background(), 9)
	var apiErr *APIError
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusBadGateway || !errors.Is(err, ErrPortUnreachable) {
		t.Errorf("nothing listening: %v, want 502 %s", err, apitype.CodePortUnreachable)
	}
	for _, port := range []int{0, -1, 65536} {
		if _, err := l.DialPort(context.Background(), port); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("port %d: %v, want ErrInvalidRequest", port, err)
		}
		if _, err := l.PortURL(port); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("PortURL(%d): %v, want ErrInvalidRequest", port, err)
		}
	}
}

// PortTransport sends the handle's credential to the lease's ports route only: a
// redirect elsewhere on the daemon goes without it.
func TestPortTransportCredential(t *testing.T) {
	var seen []string
	c, _ := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = append(seen, r.URL.RequestURI()+" "+r.Header.Get("Authorization"))
		switch r.URL.Path {
		case "/v1/leases/L1/ports/8000/app/index.html":
			http.Redirect(w, r, "/elsewhere", http.StatusFound)
		default:
			_, _ = io.WriteString(w, "ok")
		}
	}))
	l := c.OpenLease("L1", "lease-token")
	u, err := l.PortURL(8000)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(u, "/v1/leases/L1/ports/8000/") {
		t.Fatalf("PortURL %q", u)
	}
	hc := &http.Client{Transport: l.PortTransport()}
	resp, err := hc.Get(u + "app/index.html?x=1")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	want := []string{
		"/v1/leases/L1/ports/8000/app/index.html?x=1 Bearer lease-token",
		"/elsewhere ",
	}
	if strings.Join(seen, "\n") != strings.Join(want, "\n") {
		t.Errorf("requests:\n%s\nwant:\n%s", strings.Join(seen, "\n"), strings.Join(want, "\n"))
	}
}
