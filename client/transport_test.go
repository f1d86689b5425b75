package client

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/gorilla/websocket"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// With only a CA file (the production path through tlsconfig.Client), requests speak
// HTTP/2 when the server offers it, and websockets still upgrade over HTTP/1.1.
func TestCAFileHTTP2AndWebsocket(t *testing.T) {
	protos := make(chan int, 4)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		protos <- r.ProtoMajor
		if websocket.IsWebSocketUpgrade(r) {
			up := websocket.Upgrader{Subprotocols: []string{apitype.StreamProtocolV5}}
			conn, err := up.Upgrade(w, r, nil)
			if err != nil {
				return
			}
			defer conn.Close()
			_ = conn.WriteMessage(websocket.BinaryMessage, append([]byte{apitype.ChannelStdout}, "hi"...))
			_ = conn.WriteMessage(websocket.BinaryMessage, append([]byte{apitype.ChannelStatus}, `{"status":"Success"}`...))
			return
		}
		writeJSON(w, 200, apitype.Info{Version: "test"})
	}))
	srv.EnableHTTP2 = true
	c := productionClient(t, srv)
	info, err := c.Info(context.Background())
	if err != nil || info.Version != "test" {
		t.Fatalf("info %+v err %v", info, err)
	}
	if p := <-protos; p != 2 {
		t.Fatalf("request used HTTP/%d, want 2", p)
	}
	p, err := c.OpenLease("L1", "tok").Attach(context.Background(), "p1", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	out, _ := readAll(t, p)
	if st, err := p.Wait(context.Background()); err != nil || st.Status != apitype.StatusSuccess || string(out) != "hi" {
		t.Fatalf("status %+v err %v out %q", st, err, out)
	}
	if p := <-protos; p != 1 {
		t.Fatalf("websocket used HTTP/%d, want 1.1", p)
	}

	// Without the CA, the daemon's certificate is refused, and not retried as if the
	// connection had dropped.
	c2, err := New(Config{URL: srv.URL, Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c2.Info(context.Background()); err == nil {
		t.Fatal("untrusted certificate accepted")
	}
}

// CloseIdleConnections closes the kept-alive connections of both transports (the HTTP/2
// one and the HTTP/1.1 one of bulk downloads): the server sees every connection close,
// also when Config.WrapTransport wraps them in a RoundTripper that has no
// CloseIdleConnections of its own (http.Client's would then do nothing).
func TestCloseIdleConnections(t *testing.T) {
	for _, wrap := range []bool{false, true} {
		t.Run(map[bool]string{false: "as built", true: "wrapped"}[wrap], func(t *testing.T) {
			var mu sync.Mutex
			open := map[net.Conn]bool{}
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/v1/info" {
					writeJSON(w, 200, apitype.Info{Version: "test"})
					return
				}
				_, _ = w.Write([]byte("payload")) // a file download (bulk)
			}))
			srv.EnableHTTP2 = true
			srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
				mu.Lock()
				defer mu.Unlock()
				switch s {
				case http.StateNew:
					open[c] = true
				case http.StateClosed, http.StateHijacked:
					delete(open, c)
				}
			}
			c := productionClient(t, srv, func(cfg *Config) {
				if wrap {
					cfg.WrapTransport = func(next http.RoundTripper) http.RoundTripper { return roundTripFunc(next.RoundTrip) }
				}
			})
			ctx := context.Background()
			if _, err := c.Info(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := c.OpenLease("L1", "tok").ReadFile(ctx, "f"); err != nil {
				t.Fatal(err)
			}
			openConns := func() int { mu.Lock(); defer mu.Unlock(); return len(open) }
			if n := openConns(); n != 2 {
				t.Fatalf("%d connections open after an HTTP/2 request and a bulk download, want 2", n)
			}
			c.CloseIdleConnections()
			eventually(t, "every idle connection to close", func() bool { return openConns() == 0 })
			if _, err := c.Info(ctx); err != nil {
				t.Fatalf("a request after CloseIdleConnections: %v", err)
			}
		})
	}
}
