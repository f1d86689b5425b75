package daemon_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// BenchmarkSearch compares the daemon's grep and find with grep -rn and find exec'd in
// the lease, on the same tree of 10,000 files in 200 directories, in one run. Each
// iteration runs both, one after the other, so that both see the same machine load;
// the medians are reported as api-ms and exec-ms, and exec/api as their ratio:
//
//	flock /tmp/sidecar-heavy-test.lock go test -run '^$' -bench Search -benchtime 20x ./sidecar/
//
// Both sides hand their results to the client (the agent needs them): the API as JSON,
// exec as stdout. The lease's page cache is warm for both.
func BenchmarkSearch(b *testing.B) {
	d := startDaemon(b)
	l := d.acquire("bench-search")
	makeSearchTree(b, l)
	ctx := context.Background()
	exec := func(script string) func() int {
		return func() int {
			res, err := l.Exec(ctx, apitype.ExecRequest{Argv: []string{"/bin/sh", "-c", script}})
			if err != nil || res.ExitCode != 0 || res.StdoutTruncated {
				b.Fatalf("%+v %v", res, err)
			}
			return len(res.Stdout)
		}
	}
	for _, tc := range []struct {
		name      string
		api, exec func() int
	}{
		{"grep-fixed", func() int {
			res, err := l.Grep(ctx, "", "needle", client.GrepOptions{Fixed: true, MaxMatches: 100_000})
			if err != nil {
				b.Fatal(err)
			}
			return len(res.Matches)
		}, exec(`grep -rn -F needle .`)},
		{"grep-regexp", func() int {
			res, err := l.Grep(ctx, "", `^func F1[0-9]_[0-9]*\(`, client.GrepOptions{MaxMatches: 100_000})
			if err != nil {
				b.Fatal(err)
			}
			return len(res.Matches)
		}, exec(`grep -rn -E '^func F1[0-9]_[0-9]*\(' .`)},
		{"find-glob", func() int {
			res, err := l.Find(ctx, "", client.FindOptions{TreeOptions: client.TreeOptions{Globs: []string{"*.go"}}, Limit: 100_000})
			if err != nil {
				b.Fatal(err)
			}
			return len(res.Entries)
		}, exec(`find . -name '*.go'`)},
		{"exec-true", func() int { return 1 }, exec(`true; echo`)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var api, ex []time.Duration
			for b.Loop() {
				t0 := time.Now()
				if tc.api() == 0 {
					b.Fatal("api found nothing")
				}
				t1 := time.Now()
				if tc.exec() == 0 {
					b.Fatal("exec found nothing")
				}
				api, ex = append(api, t1.Sub(t0)), append(ex, time.Since(t1))
			}
			ma, me := median(api), median(ex)
			b.ReportMetric(float64(ma.Microseconds())/1000, "api-ms")
			b.ReportMetric(float64(me.Microseconds())/1000, "exec-ms")
			b.ReportMetric(float64(me)/float64(ma), "exec/api")
		})
	}
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}
