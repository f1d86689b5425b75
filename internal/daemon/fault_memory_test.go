package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// The daemon's memory is bounded by its configuration, not by what leases do (issue 19):
// many leases each run more concurrent execs than allowed, every exec writing twice the
// output limit to each stream (random bytes: the worst case of the JSON reply), marking
// that it did with a file, and then waiting until the test lets them end (another file in
// their workspace), 30 s at most: no exec ends, and frees its share of the budget, before
// every one wrote all its output. The built daemon runs as a child, so its resident set
// is read from /proc: VmHWM, the kernel's high-water mark, is the peak without sampling. The bound is the
// one docs/reliability.md states.
func TestFaultExecOutputAttack(t *testing.T) {
	const (
		leases       = 4
		perLease     = 20 // over the cap of 16
		maxExecs     = 16
		budget       = 64 << 20
		outputLimit  = 1 << 20
		perExecExtra = 256 << 10 // pipes, goroutines, read buffers, a reply piece in flight
	)
	d := newBinDaemon(t,
		"SIDECAR_LOG_LEVEL=warn",
		"SIDECAR_MAX_EXECS_PER_LEASE="+strconv.Itoa(maxExecs),
		"SIDECAR_OUTPUT_BUDGET_BYTES="+strconv.Itoa(budget),
		"SIDECAR_MAX_OUTPUT_BYTES="+strconv.Itoa(outputLimit),
	)
	d.start()
	ctx := context.Background()
	var ls []*client.Lease
	for i := range leases + 1 {
		l, err := d.client.Acquire(ctx, apitype.AcquireRequest{SessionID: fmt.Sprintf("attack-%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	attackers, bystander := ls[:leases], ls[leases]
	pid := d.Pid()
	idle := procStatusBytes(t, pid, "VmRSS")

	var refused, replied atomic.Int32
	var mu sync.Mutex
	var kept int64
	var wg sync.WaitGroup
	for _, l := range attackers {
		for range perLease {
			wg.Go(func() {
				res, err := l.Exec(ctx, apitype.ExecRequest{Argv: []string{"sh", "-c",
					"head -c 2M /dev/urandom; head -c 2M /dev/urandom >&2; : > written-$$; " +
						"for i in $(seq 300); do [ -e attack-over ] && break; sleep 0.1; done"}})
				switch {
				case errors.Is(err, client.ErrExecLimit):
					refused.Add(1)
				case err != nil:
					t.Errorf("exec: %v", err)
				default:
					// Bytes that are not UTF-8 arrive as U+FFFD, so the daemon's count of
					// kept bytes is not seen here; each kept byte is at most one rune.
					out, errOut := utf8.RuneCountInString(res.Stdout), utf8.RuneCountInString(res.Stderr)
					if res.ExitCode != 0 || !res.StdoutTruncated || !res.StderrTruncated || out > outputLimit || errOut > outputLimit {
						t.Errorf("exec under attack: exit %d, stdout %d runes (truncated %v), stderr %d runes (truncated %v)",
							res.ExitCode, out, res.StdoutTruncated, errOut, res.StderrTruncated)
					}
					replied.Add(1)
					mu.Lock()
					kept += int64(out + errOut)
					mu.Unlock()
				}
			})
		}
	}
	// Once the cap has refused every exec over it, the rest are running (waiting):
	// the daemon must still answer, and run another lease's exec in full.
	waitFor(t, "the exec cap to refuse the execs over it", time.Minute, func() bool {
		return refused.Load() == leases*(perLease-maxExecs)
	})
	hc := d.httpClient(10 * time.Second)
	resp, err := hc.Get("https://" + d.addr + "/healthz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz during the attack: %v %v", resp, err)
	}
	resp.Body.Close()
	res, err := bystander.Exec(ctx, apitype.ExecRequest{Argv: []string{"echo", "still here"}})
	if err != nil || res.Stdout != "still here\n" || res.StdoutTruncated {
		t.Fatalf("another lease's exec during the attack: %+v %v", res, err)
	}
	if n := replied.Load(); n != 0 {
		t.Fatalf("%d attacking execs had already replied: the bystander did not run during the attack", n)
	}
	for _, l := range attackers {
		waitFor(t, "every exec of the lease to write its output", time.Minute, func() bool {
			entries, err := l.List(ctx, ".")
			if err != nil {
				t.Fatal(err)
			}
			written := 0
			for _, e := range entries {
				if strings.HasPrefix(e.Name, "written-") {
					written++
				}
			}
			return written == maxExecs
		})
	}
	for _, l := range attackers {
		if err := l.WriteFile(ctx, "attack-over", nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	peak := procStatusBytes(t, pid, "VmHWM")

	if n := replied.Load(); n != leases*maxExecs {
		t.Fatalf("%d execs replied, want %d (the cap's worth)", n, leases*maxExecs)
	}
	if kept > budget {
		t.Fatalf("the replies held at least %d MiB of output together, over the %d MiB budget", kept>>20, budget>>20)
	}
	// docs/reliability.md: growth ≤ 2 × (budget + concurrent execs × perExecExtra), the 2
	// for the Go collector's headroom (GOGC=100).
	bound := 2 * (int64(budget) + leases*maxExecs*perExecExtra)
	t.Logf("daemon RSS: idle %d MiB, peak %d MiB (growth %d MiB, bound %d MiB); %d execs replied with at least %d MiB of output, %d refused",
		idle>>20, peak>>20, (peak-idle)>>20, bound>>20, replied.Load(), kept>>20, refused.Load())
	if peak-idle > bound {
		t.Fatalf("daemon RSS grew by %d MiB under the attack, over the documented bound of %d MiB", (peak-idle)>>20, bound>>20)
	}
}

// procStatusBytes reads a "kB" field of /proc/<pid>/status, in bytes.
func procStatusBytes(t *testing.T, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == field+":" {
			kib, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kib << 10
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}
