package process

import (
	"errors"
	"io"
	"os/exec"
	"runtime"
	"testing"
)

// BenchmarkSubscriptionThroughput pushes 256 MiB from a real process through a pipe, the
// replay ring and a Subscription, next to the same process read straight from a pipe
// (the ratio is the figure to quote; absolute numbers depend on the machine's load).
// Run with -benchtime=3x or so.
func BenchmarkSubscriptionThroughput(b *testing.B) {
	const total = 256 << 20
	script := sh("head -c 268435456 /dev/zero")
	b.Run("raw-pipe", func(b *testing.B) {
		b.SetBytes(total)
		for b.Loop() {
			cmd := exec.Command(script.Argv[0], script.Argv[1:]...)
			out, err := cmd.StdoutPipe()
			if err != nil {
				b.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			buf := make([]byte, readSize)
			n, err := io.CopyBuffer(io.Discard, struct{ io.Reader }{out}, buf)
			if err != nil || n != total {
				b.Fatalf("copied %d: %v", n, err)
			}
			if err := cmd.Wait(); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, lossless := range []bool{false, true} {
		name := "subscription"
		if lossless {
			name = "subscription-lossless"
		}
		b.Run(name, func(b *testing.B) { benchSubscription(b, script, total, lossless) })
	}
}

// benchSubscription reads total bytes of script's output through one Subscription.
func benchSubscription(b *testing.B, script Spec, total int64, lossless bool) {
	{
		m := newManager(b, Config{})
		b.SetBytes(total)
		var lost int64
		for b.Loop() {
			p, _, err := m.Start(b.Context(), "lease", StartRequest{Spec: script, Lossless: lossless})
			if err != nil {
				b.Fatal(err)
			}
			s, err := p.Subscribe(0)
			if lossless {
				s, err = p.SubscribeLossless(0)
			}
			if err != nil {
				b.Fatal(err)
			}
			var got int64
			for {
				c, err := s.Next(b.Context())
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					b.Fatal(err)
				}
				got += int64(len(c.Data))
			}
			if got+s.Lost() != total {
				b.Fatalf("got %d + lost %d != %d", got, s.Lost(), total)
			}
			lost += s.Lost()
		}
		b.ReportMetric(float64(lost)/float64(b.N), "lost-bytes/op")
	}
}

// BenchmarkIdleProcessMemory reports the daemon-side memory (heap and goroutine stacks)
// per idle background process (100 `sleep` processes started, measured, released).
func BenchmarkIdleProcessMemory(b *testing.B) {
	const n = 100
	m := newManager(b, Config{MaxProcesses: n})
	var perProc float64
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for range n {
			if _, _, err := m.Start(b.Context(), "lease", StartRequest{Spec: Spec{Argv: []string{"sleep", "1000"}}}); err != nil {
				b.Fatal(err)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		perProc += float64(int64(after.HeapAlloc+after.StackInuse)-int64(before.HeapAlloc+before.StackInuse)) / n
		b.StopTimer()
		m.ReleaseLease("lease")
		b.StartTimer()
	}
	b.ReportMetric(perProc/float64(b.N), "bytes/process")
}
