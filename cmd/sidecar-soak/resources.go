package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sidecar-sandbox/sidecar/cmd/sidecar-soak/workload"
	"github.com/sidecar-sandbox/sidecar/internal/daemontest"
)

// resources is what the daemon holds that a leak would grow. -1 means unknown (a
// remote daemon's host is not ours to look at).
type resources struct {
	leases     int   // listed by the API
	goroutines int   // go_goroutines from /metrics
	fds        int   // process_open_fds from /metrics
	cgroups    int   // under the daemon's cgroup parent
	leaseDirs  int   // in the work root
	uidProcs   int   // processes running as a lease uid
	rss        int64 // resident set, bytes
	heap       int64 // go_memstats_heap_inuse_bytes from /metrics: what RSS keeps after a GC returns it
}

func (r resources) String() string {
	return fmt.Sprintf("leases %d, goroutines %d, fds %d, cgroups %d, lease dirs %d, lease-uid processes %d, RSS %s, heap in use %s",
		r.leases, r.goroutines, r.fds, r.cgroups, r.leaseDirs, r.uidProcs, mib(r.rss), mib(r.heap))
}

// leakedSince counts what r holds beyond idle: exactly, since both were counted the same
// way with no client connection kept alive but the one that scrapes /metrics.
func (r resources) leakedSince(idle resources) int {
	n := 0
	over := func(now, before, slack int) {
		if now >= 0 && before >= 0 && now > before+slack {
			n += now - before - slack
		}
	}
	over(r.leases, 0, 0)
	over(r.goroutines, idle.goroutines, 0)
	over(r.fds, idle.fds, 0)
	over(r.cgroups, idle.cgroups, 0)
	over(r.leaseDirs, idle.leaseDirs, 0)
	over(r.uidProcs, 0, 0)
	return n
}

func (t *target) count(ctx context.Context) resources {
	r := resources{leases: -1, goroutines: -1, fds: -1, cgroups: -1, leaseDirs: -1, uidProcs: -1, rss: -1, heap: -1}
	if ls, err := t.client.List(ctx); err == nil {
		r.leases = len(ls)
	}
	// Connections this program keeps alive are the client's, not a leak of the daemon's:
	// they end before counting (otherwise up to 16 idle HTTP/1.1 connections of bulk
	// downloads, a goroutine and a descriptor each, read as a leak until the daemon's
	// 120 s idle timeout). The scrape below then holds the only connection.
	t.client.CloseIdleConnections()
	t.hc.CloseIdleConnections()
	m := t.metrics(ctx)
	if v, ok := m["go_goroutines"]; ok {
		r.goroutines = int(v)
	}
	if v, ok := m["process_open_fds"]; ok {
		r.fds = int(v)
	}
	if v, ok := m["process_resident_memory_bytes"]; ok {
		r.rss = int64(v)
	}
	if v, ok := m["go_memstats_heap_inuse_bytes"]; ok {
		r.heap = int64(v)
	}
	if t.local == nil {
		return r
	}
	r.rss = t.rss()
	r.cgroups = 0
	for _, p := range daemontest.CgroupParents(t.local.Parent) {
		entries, _ := os.ReadDir(p)
		for _, e := range entries {
			if e.IsDir() {
				r.cgroups++
			}
		}
	}
	dirs, _ := os.ReadDir(filepath.Join(t.local.StateDir, "leases"))
	r.leaseDirs = len(dirs)
	r.uidProcs = len(workload.ProcsOfUIDs(t.local.UIDFirst, t.local.UIDLast))
	return r
}

// settle counts resources until they stop falling (bounded: 30 s), or, with want, until
// nothing is held beyond it.
func settle(ctx context.Context, t *target, want *resources) resources {
	deadline := time.Now().Add(30 * time.Second)
	var last resources
	for {
		r := t.count(ctx)
		done := false
		if want != nil {
			done = r.leakedSince(*want) == 0
		} else {
			counts, prev := r, last
			counts.rss, counts.heap, prev.rss, prev.heap = 0, 0, 0, 0 // memory moves; counts settle
			done = counts == prev
		}
		if done || time.Now().After(deadline) || ctx.Err() != nil {
			return r
		}
		last = r
		time.Sleep(500 * time.Millisecond) // poll interval
	}
}

// rss reads the daemon's resident set from /proc (local) or /metrics (remote).
func (t *target) rss() int64 {
	if t.local == nil {
		if v, ok := t.metrics(context.Background())["process_resident_memory_bytes"]; ok {
			return int64(v)
		}
		return -1
	}
	if ps := daemontest.ReadProcStatus(t.local.Pid()); ps.Err == nil {
		return ps.RSSKB << 10
	}
	return -1
}

// metrics scrapes the untyped samples without labels from /metrics.
func (t *target) metrics(ctx context.Context) map[string]float64 {
	out := map[string]float64{}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.url+"/metrics", nil)
	if err != nil {
		return out
	}
	req.Header.Set("Authorization", "Bearer "+t.token)
	resp, err := t.hc.Do(req)
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 8<<20))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || strings.Contains(line, "{") {
			continue
		}
		if name, val, ok := strings.Cut(line, " "); ok {
			if v, err := strconv.ParseFloat(strings.TrimSpace(val), 64); err == nil {
				out[name] = v
			}
		}
	}
	return out
}

func mib(b int64) string {
	if b < 0 {
		return "unknown"
	}
	return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
}

func (r report) print(w io.Writer) {
	fmt.Fprintf(w, "sidecar-soak: %d leases at once for %v\n", r.leases, r.duration.Round(time.Second))
	fmt.Fprintf(w, "  rounds      %d (each: acquire, exec, write, upload, read back, background process, release)\n", r.rounds)
	fmt.Fprintf(w, "  operations  %d\n", r.ops)
	fmt.Fprintf(w, "  errors      %d\n", r.errors)
	if r.firstErr != nil {
		fmt.Fprintf(w, "  first error %v\n", r.firstErr)
	}
	fmt.Fprintf(w, "  latency     p50 %v, p99 %v, max %v\n", r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond), r.max.Round(time.Microsecond))
	fmt.Fprintf(w, "  daemon RSS  idle %s, peak %s, final %s\n", mib(r.idle.rss), mib(r.peakRSS), mib(r.final.rss))
	fmt.Fprintf(w, "  daemon heap idle %s, final %s after %v (in use, from /metrics; near idle: at most %s)\n",
		mib(r.idle.heap), mib(r.final.heap), r.heapWait.Round(time.Second), mib(nearIdle(r.idle.heap)))
	fmt.Fprintf(w, "  idle        %v\n", r.idle)
	fmt.Fprintf(w, "  final       %v\n", r.final)
	fmt.Fprintf(w, "  leaked      %d\n", r.leaked())
}
