package client

import (
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// BenchmarkAttachThroughput: output through a loopback TLS websocket into Stdout, as a
// lossy and as a lossless viewer (the same bytes; lossless only adds the mode check).
func BenchmarkAttachThroughput(b *testing.B) {
	for _, lossless := range []bool{false, true} {
		name := "lossy"
		if lossless {
			name = "lossless"
		}
		b.Run(name, func(b *testing.B) { benchAttach(b, lossless) })
	}
}

func benchAttach(b *testing.B, lossless bool) {
	const total = 64 << 20
	frame := append([]byte{apitype.ChannelStdout}, bytes.Repeat([]byte("x"), 32<<10)...)
	c, _ := newTestClient(b, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		up := websocket.Upgrader{Subprotocols: []string{apitype.StreamProtocolV5}, ReadBufferSize: wsBufferSize, WriteBufferSize: wsBufferSize}
		h := http.Header{apitype.HeaderOutputMode: {apitype.OutputModeLossy}}
		if r.URL.Query().Get("lossless") == "1" {
			h.Set(apitype.HeaderOutputMode, apitype.OutputModeLossless)
		}
		conn, err := up.Upgrade(w, r, h)
		if err != nil {
			return
		}
		defer conn.Close()
		for sent := 0; sent < total; sent += len(frame) - 1 {
			if conn.WriteMessage(websocket.BinaryMessage, frame) != nil {
				return
			}
		}
		_ = conn.WriteMessage(websocket.BinaryMessage, append([]byte{apitype.ChannelStatus}, `{"status":"Success"}`...))
	}))
	b.SetBytes(total)
	for b.Loop() {
		p, err := c.OpenLease("L1", "tok").AttachWith(context.Background(), "p1", AttachOptions{Lossless: lossless})
		if err != nil {
			b.Fatal(err)
		}
		go io.Copy(io.Discard, p.Stderr)
		if n, _ := io.Copy(io.Discard, p.Stdout); n != total {
			b.Fatalf("read %d bytes", n)
		}
		p.Close()
	}
}

// BenchmarkUpload: a resumable upload (one PATCH of 64 MiB with a known digest, as the
// daemon's clients send) into a server that discards it, through the production
// transport (CA file), so the protocol's own cost shows without the disk's: "h1" is the
// client as it is (uploads on its bulk HTTP/1.1 transport), "h2" the upload sent on the
// HTTP/2 transport instead to a server with the daemon's HTTP/2 settings, "h2-default"
// the same with Go's default settings on both ends.
func BenchmarkUpload(b *testing.B) {
	data := bytes.Repeat([]byte("u"), 64<<20)
	sum := sha256.Sum256(data)
	for _, bc := range []struct {
		name string
		h2   bool
		conf *http.HTTP2Config
	}{
		{"h1", false, nil},
		{"h2", true, &http.HTTP2Config{MaxReceiveBufferPerConnection: 4<<20 - 1, MaxReceiveBufferPerStream: 4<<20 - 1, MaxReadFrameSize: 256 << 10}},
		{"h2-default", true, nil},
	} {
		b.Run(bc.name, func(b *testing.B) {
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.CopyBuffer(io.Discard, r.Body, make([]byte, 1<<20))
				w.WriteHeader(http.StatusNoContent)
			}))
			srv.EnableHTTP2 = bc.h2
			srv.Config.HTTP2 = bc.conf
			c := productionClient(b, srv)
			if bc.h2 {
				c.bulk = nil // requests take the HTTP/2 transport
				if bc.conf == nil {
					c.hc.Transport.(*http.Transport).HTTP2 = nil
				}
			}
			b.SetBytes(int64(len(data)))
			defer reportCPU(b, int64(len(data)))()
			for b.Loop() {
				if err := c.OpenLease("L1", "tok").Upload(context.Background(), "f", bytes.NewReader(data), int64(len(data)), UploadOptions{SHA256: sum[:]}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDownload: a verified download (the server sends the digest, as the daemon does
// for ?digest=sha-256) from a server that serves it from memory, through the production
// transport, so the client's own cost shows: its TLS reads and its sha-256. "4KiB" is a
// small file, as agents read most files (ReadFile is a Download into a buffer).
func BenchmarkDownload(b *testing.B) {
	for _, size := range []int{4 << 10, 64 << 20} {
		b.Run(sizeLabel(size), func(b *testing.B) {
			data := bytes.Repeat([]byte("d"), size)
			sum := sha256.Sum256(data)
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set(apitype.HeaderContentDigest, apitype.FormatDigest(sum[:]))
				w.Header().Set("Content-Length", strconv.Itoa(len(data)))
				_, _ = w.Write(data)
			}))
			c := productionClient(b, srv)
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			defer reportCPU(b, int64(len(data)))()
			for b.Loop() {
				n, err := c.OpenLease("L1", "tok").Download(context.Background(), "f", io.Discard)
				if err != nil || n != int64(len(data)) {
					b.Fatal(n, err)
				}
			}
		})
	}
}

func sizeLabel(n int) string {
	if n >= 1<<20 {
		return strconv.Itoa(n>>20) + "MiB"
	}
	return strconv.Itoa(n>>10) + "KiB"
}

// reportCPU, deferred before a benchmark's loop, reports the CPU time the process (client
// and server both) spent per byte moved: on a shared machine it varies far less than the
// rate does, since a busy neighbour slows the rate without adding to it.
func reportCPU(b *testing.B, bytesPerOp int64) func() {
	start := cpuTime()
	return func() {
		if b.N > 0 {
			b.ReportMetric(float64(cpuTime()-start)/float64(int64(b.N)*bytesPerOp), "cpu-ns/B")
		}
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
