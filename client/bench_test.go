package client

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"testing"

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

// BenchmarkUpload: a resumable upload (hash pass plus one PATCH) into a discarding server.
func BenchmarkUpload(b *testing.B) {
	data := bytes.Repeat([]byte("u"), 64<<20)
	c, _ := newTestClient(b, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
	}))
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if err := c.OpenLease("L1", "tok").Upload(context.Background(), "f", bytes.NewReader(data), int64(len(data)), UploadOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}
