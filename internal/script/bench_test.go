package script

import (
	"context"
	"os"
	"testing"
	"time"
)

const benchScript = `function transform(input) {
	return {names: input.users.map(u => u.name.toUpperCase()), n: input.users.length};
}`

const benchInput = `{"users":[{"name":"ada"},{"name":"grace"},{"name":"linus"}]}`

// BenchmarkWarm is one small transform on a warm pool, end to end.
func BenchmarkWarm(b *testing.B) {
	r := newRunner(b, nil)
	if _, err := run(b, r, benchScript, benchInput); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := run(b, r, benchScript, benchInput); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParallel4 is four concurrent callers on the default pool of two workers.
func BenchmarkParallel4(b *testing.B) {
	r := newRunner(b, nil)
	if _, err := run(b, r, benchScript, benchInput); err != nil {
		b.Fatal(err)
	}
	b.SetParallelism(4)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := r.Run(context.Background(), Request{Source: benchScript, Input: []byte(benchInput)}); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkColdFirstCall is New to first result with an empty compilation cache
// (the first start of a daemon) and with a warm one (every later start).
func BenchmarkColdFirstCall(b *testing.B) {
	for _, tc := range []struct {
		name  string
		cache func(b *testing.B) string
	}{
		{"empty-cache", func(b *testing.B) string {
			dir, err := os.MkdirTemp("", "sidecar-script-bench-")
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { os.RemoveAll(dir) })
			return dir
		}},
		{"warm-cache", func(b *testing.B) string {
			primeCache(b)
			return testCache
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var total time.Duration
			for b.Loop() {
				b.StopTimer()
				cache := tc.cache(b)
				b.StartTimer()
				start := time.Now()
				r := newRunner(b, func(c *Config) { c.CacheDir = cache; c.Workers = 1 })
				if _, err := run(b, r, benchScript, benchInput); err != nil {
					b.Fatal(err)
				}
				total += time.Since(start)
				b.StopTimer()
				r.Close()
				b.StartTimer()
			}
			b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/first-result")
		})
	}
}

// primeCache makes sure the shared compilation cache holds the compiled module.
func primeCache(b *testing.B) {
	r := newRunner(b, func(c *Config) { c.Workers = 1 })
	if _, err := run(b, r, benchScript, benchInput); err != nil {
		b.Fatal(err)
	}
	r.Close()
}

// BenchmarkWarmPaced is BenchmarkWarm with 20 ms of idle (untimed) between calls: the
// gaps in which workers make their spare runtimes, as between an agent's calls.
func BenchmarkWarmPaced(b *testing.B) {
	r := newRunner(b, nil)
	if _, err := run(b, r, benchScript, benchInput); err != nil {
		b.Fatal(err)
	}
	var worker time.Duration
	for b.Loop() {
		b.StopTimer()
		time.Sleep(20 * time.Millisecond)
		b.StartTimer()
		res, err := run(b, r, benchScript, benchInput)
		if err != nil {
			b.Fatal(err)
		}
		worker += res.Duration
	}
	b.ReportMetric(float64(worker.Microseconds())/float64(b.N), "µs-worker/op")
}

// BenchmarkWarmBurst is bursts of 8 back-to-back calls (the pool's spares: 2 workers × 4)
// after 100 ms of idle (untimed); ns/op is per call.
func BenchmarkWarmBurst(b *testing.B) {
	r := newRunner(b, nil)
	if _, err := run(b, r, benchScript, benchInput); err != nil {
		b.Fatal(err)
	}
	for i := 0; b.Loop(); i++ {
		if i%8 == 0 {
			b.StopTimer()
			time.Sleep(100 * time.Millisecond)
			b.StartTimer()
		}
		if _, err := run(b, r, benchScript, benchInput); err != nil {
			b.Fatal(err)
		}
	}
}
