package daemon_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/daemon"
	"github.com/sidecar-sandbox/sidecar/tls/tlsconfig"
)

// transferBytes is the size of the file BenchmarkTransfer moves.
const transferBytes = 256 << 20

// BenchmarkTransfer moves one big file through the real client and daemon (a lease on its
// loop-mounted ext4 filesystem) beside raw TLS 1.3 on loopback in the same process, so
// that each cost shows alone: upload = digest + fsync + atomic rename, download = digest,
// over HTTP/2 and HTTP/1.1. `go test -run X -bench Transfer -benchtime 3x ./internal/daemon/`.
func BenchmarkTransfer(b *testing.B) {
	d := startDaemon(b, func(c *daemon.Config) { c.DiskQuota = "loop" })
	ctx := context.Background()
	local := filepath.Join(b.TempDir(), "big.bin")
	data := make([]byte, transferBytes)
	_, _ = rand.Read(data)
	if err := os.WriteFile(local, data, 0o600); err != nil {
		b.Fatal(err)
	}
	sum := sha256.Sum256(data)
	data = nil

	b.Run("tls-floor", func(b *testing.B) {
		addr := tlsFloor(b, d.caFile, d.keyFile)
		buf := make([]byte, 256<<10)
		b.SetBytes(transferBytes)
		defer reportCPU(b, transferBytes)()
		for b.Loop() {
			if err := tlsSend(addr, buf, transferBytes); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, proto := range []string{"h2", "h1"} {
		c := transferClient(b, d, proto == "h1")
		l, err := c.Acquire(ctx, apitype.AcquireRequest{SessionID: "bench-transfer-" + proto,
			Limits: apitype.Limits{MemoryBytes: 256 << 20, DiskBytes: 3 * transferBytes}})
		if err != nil {
			b.Fatal(err)
		}
		upload := func(b *testing.B) {
			f, err := os.Open(local)
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			if err := l.Upload(ctx, "big.bin", f, transferBytes, client.UploadOptions{SHA256: sum[:]}); err != nil {
				b.Fatal(err)
			}
		}
		b.Run("upload-"+proto, func(b *testing.B) {
			b.SetBytes(transferBytes)
			defer reportCPU(b, transferBytes)()
			for b.Loop() {
				upload(b)
			}
		})
		b.Run("download-"+proto, func(b *testing.B) {
			if _, err := l.Stat(ctx, "big.bin"); err != nil { // the upload rows were left out
				upload(b)
			}
			b.SetBytes(transferBytes)
			defer reportCPU(b, transferBytes)()
			for b.Loop() {
				if n, err := l.Download(ctx, "big.bin", io.Discard); err != nil || n != transferBytes {
					b.Fatal(n, err)
				}
			}
		})
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// transferClient is a client of d without the contract check (it would hold the bodies),
// speaking HTTP/1.1 only when http1.
func transferClient(b *testing.B, d *testDaemon, http1 bool) *client.Client {
	cfg := client.Config{URL: d.url, Token: testToken, CAFile: d.caFile}
	if http1 {
		tlsConf, err := tlsconfig.Client(d.caFile, "", "")
		if err != nil {
			b.Fatal(err)
		}
		tlsConf.NextProtos = []string{"http/1.1"}
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.TLSClientConfig = tlsConf
		t.ForceAttemptHTTP2 = false
		t.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
		cfg.HTTPClient = &http.Client{Transport: t}
	}
	c, err := client.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	return c
}

// tlsFloor serves TLS 1.3 on loopback with the daemon's certificate: it reads all a
// connection sends and answers one byte. It returns the address.
func tlsFloor(b *testing.B, certFile, keyFile string) string {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		b.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if _, err := io.CopyBuffer(io.Discard, c, make([]byte, 256<<10)); err == nil {
					_, _ = c.Write([]byte{1})
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// tlsSend pushes n bytes of buf, repeated, through a fresh connection to addr and waits
// for the acknowledgement.
func tlsSend(addr string, buf []byte, n int64) error {
	c, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}) // the test's own certificate
	if err != nil {
		return err
	}
	defer c.Close()
	for left := n; left > 0; left -= int64(len(buf)) {
		if _, err := c.Write(buf[:min(left, int64(len(buf)))]); err != nil {
			return err
		}
	}
	if err := c.CloseWrite(); err != nil {
		return err
	}
	_, err = io.ReadFull(c, make([]byte, 1))
	return err
}

// reportCPU, deferred before a benchmark's loop, reports the CPU time this process (the
// daemon and the client both) spent per byte: a busy neighbour lowers the rate but adds
// little to it. The kernel's own threads (a loop device's worker) are not counted.
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
