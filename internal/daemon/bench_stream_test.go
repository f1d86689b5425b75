package daemon_test

import (
	"context"
	"fmt"
	"io"
	"testing"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// streamBytes is what BenchmarkAttachStdout's process writes to stdout.
const streamBytes = 64 << 20

// BenchmarkAttachStdout is stdout through an attach, end to end: a process in a lease
// writes streamBytes (`head -c`), the real client reads them to the end through the
// daemon's websocket over TLS. Lossless, the process waits for the reader, so the figure
// is what the daemon's output path delivers; lossy, it counts delivered bytes only.
// cpu-ns/B is the test process's CPU time (daemon and client, not the lease's process)
// per byte, steadier than the rate on a loaded machine.
// `go test -run X -bench AttachStdout -benchtime 5x ./internal/daemon/`.
func BenchmarkAttachStdout(b *testing.B) {
	d := startDaemon(b)
	ctx := context.Background()
	l, err := d.client.Acquire(ctx, apitype.AcquireRequest{SessionID: "bench-stream"})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Release(ctx)
	argv := []string{"head", "-c", fmt.Sprint(streamBytes), "/dev/zero"}
	for _, lossless := range []bool{true, false} {
		name := "lossless"
		if !lossless {
			name = "lossy"
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(streamBytes)
			defer reportCPU(b, streamBytes)()
			var got, lost int64
			for b.Loop() {
				p, err := l.Start(ctx, apitype.StartRequest{Argv: argv, Lossless: lossless})
				if err != nil {
					b.Fatal(err)
				}
				go func() { _, _ = io.Copy(io.Discard, p.Stderr) }()
				n, err := io.Copy(io.Discard, p.Stdout)
				if err != nil {
					b.Fatal(err)
				}
				st, err := p.Wait(ctx)
				if err != nil || st.ExitCode != 0 {
					b.Fatal(st, err)
				}
				got, lost = got+n, lost+p.Lost()
				p.Close()
			}
			if lossless && lost > 0 {
				b.Fatalf("a lossless attach lost %d bytes", lost)
			}
			b.ReportMetric(float64(got)/float64(got+lost), "delivered")
		})
	}
}
