package daemon_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/daemon"
	"github.com/sidecar-sandbox/sidecar/sidecar"
)

// Hostile HTTP: each abuse is cut off at its documented limit (made small here so the
// test is quick) while /healthz and another lease keep answering.

// hostileLimits are the daemon's HTTP limits in these tests.
var hostileLimits = sidecar.HTTPLimits{
	MaxHeaderBytes:    8 << 10,
	MaxJSONBytes:      64 << 10,
	ReadHeaderTimeout: time.Second,
	IdleTimeout:       time.Second,
}

// bystander keeps asking /healthz and a lease of its own while the test abuses the
// daemon; stop returns how many requests it made and the failures it saw.
func bystander(t *testing.T, d *testDaemon) (stop func() (int64, []error)) {
	t.Helper()
	l := d.acquire("bystander")
	hc := d.httpClient()
	hc.Timeout = 10 * time.Second
	var n atomic.Int64
	var mu sync.Mutex
	var errs []error
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			resp, err := hc.Get(d.url + "/healthz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					err = fmt.Errorf("/healthz: %s", resp.Status)
				}
			}
			if err == nil {
				_, err = l.Get(ctx)
			}
			if err != nil && ctx.Err() == nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
			n.Add(1)
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond): // request pacing
			}
		}
	}()
	return func() (int64, []error) {
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		return n.Load(), errs
	}
}

// tlsDial opens a raw TLS connection speaking HTTP/1.1 only.
func (d *testDaemon) tlsDial(t *testing.T) *tls.Conn {
	t.Helper()
	pem, err := os.ReadFile(d.caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	c, err := tls.Dial("tcp", strings.TrimPrefix(d.url, "https://"), &tls.Config{RootCAs: pool, NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestFaultHostileHTTP(t *testing.T) {
	d := startFaultDaemon(t, func(c *daemon.Config) { c.HTTP = hostileLimits })
	stop := bystander(t, d)
	l := d.acquire("victim")

	t.Run("slowloris", func(t *testing.T) {
		c := d.tlsDial(t)
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n"); err != nil {
			t.Fatal(err)
		}
		// One header byte every 200 ms: 60 bytes would take 12 s; the daemon must hang
		// up at its 1 s ReadHeaderTimeout long before the header is complete.
		hungUp := make(chan struct{})
		go func() { _, _ = io.Copy(io.Discard, c); close(hungUp) }() // ends when the daemon closes
		header := "X-Slow: " + strings.Repeat("a", 50) + "\r\n\r\n"
		cut := false
		for i := 0; i < len(header) && !cut; i++ {
			if _, err := c.Write([]byte{header[i]}); err != nil {
				cut = true
				break
			}
			select {
			case <-hungUp:
				cut = true
			case <-time.After(200 * time.Millisecond): // the attack's pace
			}
		}
		if !cut {
			t.Fatal("a slowloris client sent its whole header: the read-header timeout never fired")
		}
	})

	t.Run("huge header", func(t *testing.T) {
		status, _, _ := d.raw(http.MethodGet, "/v1/leases/"+l.ID(), testToken, nil,
			map[string]string{"X-Huge": strings.Repeat("h", 16<<10)})
		if status != http.StatusRequestHeaderFieldsTooLarge {
			t.Fatalf("a 16 KiB header over an 8 KiB limit: %d, want 431", status)
		}
	})

	t.Run("huge JSON body", func(t *testing.T) {
		body := `{"argv":["true"],"env":{"A":"` + strings.Repeat("b", 128<<10) + `"}}`
		status, hdr, resp := d.raw(http.MethodPost, "/v1/leases/"+l.ID()+"/exec", testToken, strings.NewReader(body), nil)
		wantProblem(t, status, hdr, resp, http.StatusRequestEntityTooLarge, apitype.CodePayloadTooLarge)
		status, hdr, resp = d.raw(http.MethodPost, "/v1/leases", testToken, strings.NewReader(`{"session_id":"`+strings.Repeat("s", 128<<10)+`"}`), nil)
		wantProblem(t, status, hdr, resp, http.StatusRequestEntityTooLarge, apitype.CodePayloadTooLarge)
	})

	t.Run("endless chunked body", func(t *testing.T) {
		// No Content-Length: the cap applies to what streams in, not to a declared size.
		pr, pw := io.Pipe()
		go func() {
			chunk := []byte(`{"argv":["true"],"env":{"A":"` + strings.Repeat("c", 32<<10))
			_, _ = pw.Write(chunk)
			for {
				if _, err := pw.Write([]byte(strings.Repeat("c", 32<<10))); err != nil {
					return
				}
			}
		}()
		defer pw.CloseWithError(io.ErrClosedPipe)
		status, hdr, resp := d.raw(http.MethodPost, "/v1/leases/"+l.ID()+"/exec", testToken, pr, nil)
		wantProblem(t, status, hdr, resp, http.StatusRequestEntityTooLarge, apitype.CodePayloadTooLarge)
	})

	t.Run("idle keep-alive", func(t *testing.T) {
		c := d.tlsDial(t)
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("first request: %v %v", resp, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		// Now say nothing: the daemon closes at its 1 s IdleTimeout.
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		_, err = br.ReadByte()
		var ne net.Error
		if err == nil || errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("an idle keep-alive was not closed within 30 s: %v", err)
		}
	})

	t.Run("stray websocket upgrades", func(t *testing.T) {
		ws := map[string]string{
			"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
			"Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Protocol": apitype.StreamProtocolV5,
		}
		for _, c := range []struct{ method, path string }{
			{http.MethodGet, "/healthz"},
			{http.MethodGet, "/v1/info"},
			{http.MethodGet, "/v1/leases/" + l.ID()},
			{http.MethodGet, "/v1/leases/" + l.ID() + "/processes"},
			{http.MethodGet, "/v1/leases/" + l.ID() + "/files/"},
			{http.MethodGet, "/metrics"},
		} {
			status, hdr, body := d.raw(c.method, c.path, testToken, nil, ws)
			if status == http.StatusSwitchingProtocols || hdr.Get("Upgrade") != "" {
				t.Fatalf("%s %s upgraded a stray websocket request: %d %v", c.method, c.path, status, hdr)
			}
			if status >= 500 {
				t.Fatalf("%s %s with a stray upgrade: %d %s", c.method, c.path, status, body)
			}
		}
		// A stream route without a channel subprotocol is refused before anything starts.
		delete(ws, "Sec-WebSocket-Protocol")
		status, hdr, body := d.raw(http.MethodGet, "/v1/leases/"+l.ID()+"/exec?command=true", testToken, nil, ws)
		wantProblem(t, status, hdr, body, http.StatusBadRequest, apitype.CodeInvalidRequest)
		if procs := must(l.Processes(context.Background()))(t); len(procs) != 0 {
			t.Fatalf("a refused upgrade started a process: %+v", procs)
		}
	})

	n, errs := stop()
	if len(errs) > 0 {
		t.Fatalf("the bystander saw %d failures in %d rounds while the daemon was abused, first: %v", len(errs), n, errs[0])
	}
	if n < 5 {
		t.Fatalf("the bystander made only %d rounds: it proves nothing", n)
	}
	t.Logf("bystander: %d rounds of /healthz + GET lease, no failure", n)
	// The victim lease itself still serves.
	if r := must(l.Exec(context.Background(), sh("echo alive")))(t); r.Stdout != "alive\n" {
		t.Fatalf("victim lease after the abuse: %+v", r)
	}
}
