package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// The daemon's memory is bounded by its search budget, not by what grep patterns cost
// (issue 31). First the attack as it was run: a lease token sends 12 concurrent greps of
// a{1000} repeated to near the header limit (2.6 million instructions each; 220-360 MB
// of heap a request before); every one is refused by its cost. Then the costliest
// patterns the daemon accepts, 12 at once from each of three leases, over files of long
// matching lines with context, so that every admitted search fills its result: the
// lease's and the daemon's limits refuse the searches over them, and the daemon's
// resident set grows by no more than docs/reliability.md states. VmHWM, the kernel's
// high-water mark, is the peak without sampling.
func TestFaultGrepMemoryAttack(t *testing.T) {
	const (
		leases         = 3
		perLease       = 12
		maxSearches    = 16
		perLeaseMax    = 4 // fsxfer.MaxSearchesPerLease
		budget         = 64 << 20
		perSearchExtra = 2 << 20 // goroutines, pooled read buffers, the request and the reply's buffers
	)
	d := newBinDaemon(t,
		"SIDECAR_LOG_LEVEL=warn",
		"SIDECAR_MAX_SEARCHES="+strconv.Itoa(maxSearches),
		"SIDECAR_SEARCH_BUDGET_BYTES="+strconv.Itoa(budget),
	)
	d.start()
	ctx := context.Background()
	var ls []*client.Lease
	for i := range leases + 1 {
		l, err := d.client.Acquire(ctx, apitype.AcquireRequest{SessionID: fmt.Sprintf("grep-attack-%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	attackers, bystander := ls[:leases], ls[leases]
	line := strings.Repeat("x", 1000)
	for _, l := range ls {
		res, err := l.Exec(ctx, apitype.ExecRequest{Argv: []string{"sh", "-c",
			"mkdir d && for i in $(seq 20); do yes " + line + " | head -c 1048576 > d/f$i.txt; done; echo needle > needle.txt"}})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("writing the files: %+v %v", res, err)
		}
	}
	pid := d.Pid()
	idle := procStatusBytes(t, pid, "VmRSS")

	// The attack's own pattern: refused by its cost, every time.
	attack := strings.Repeat("a{1000}", 2600)
	var wg sync.WaitGroup
	for range 12 {
		wg.Go(func() {
			_, err := attackers[0].Grep(ctx, "", attack, client.GrepOptions{})
			var apiErr *client.APIError
			if !errors.Is(err, client.ErrPatternTooComplex) || !errors.As(err, &apiErr) || apiErr.Status != 400 {
				t.Errorf("the attack's pattern: %v, want 400 pattern_too_complex", err)
			}
		})
	}
	wg.Wait()

	// The costliest patterns accepted (9,002 instructions), matching every line.
	costly := "x|" + strings.Repeat("a{1000}", 9)
	var ok, limited atomic.Int32
	var mu sync.Mutex
	reasons := map[string]int{}
	for _, l := range attackers {
		for range perLease {
			wg.Go(func() {
				res, err := l.Grep(ctx, "d", costly, client.GrepOptions{Context: 10, MaxMatches: 100_000})
				switch {
				case errors.Is(err, client.ErrSearchLimit):
					limited.Add(1)
				case err != nil:
					t.Errorf("grep: %v", err)
				default:
					// Alone, a search stops at 16 MiB of text; beside the others, where the
					// budget ran out (possibly before its first match).
					if !res.Truncated || (res.Reason != "bytes" && res.Reason != "memory") || (len(res.Matches) == 0 && res.Reason != "memory") {
						t.Errorf("grep under attack: %d matches, truncated %v %q", len(res.Matches), res.Truncated, res.Reason)
					}
					ok.Add(1)
					mu.Lock()
					reasons[res.Reason]++
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	peak := procStatusBytes(t, pid, "VmHWM")
	if ok.Load() == 0 || limited.Load() < leases*(perLease-perLeaseMax) {
		t.Fatalf("%d searches answered, %d refused with search_limit; want some answered and at least %d refused (%d per lease at once)",
			ok.Load(), limited.Load(), leases*(perLease-perLeaseMax), perLeaseMax)
	}
	// Everything is given back: a search within the budget answers in full.
	res, err := bystander.Grep(ctx, "", "needle", client.GrepOptions{Fixed: true})
	if err != nil || res.Truncated || len(res.Matches) != 1 {
		t.Fatalf("a search after the attack: %+v %v", res, err)
	}
	// docs/reliability.md: growth ≤ 2 × (budget + concurrent searches × perSearchExtra),
	// the 2 for the Go collector's headroom (GOGC=100).
	bound := int64(2 * (budget + leases*perLeaseMax*perSearchExtra))
	t.Logf("daemon RSS: idle %d MiB, peak %d MiB (growth %d MiB, bound %d MiB); %d searches answered %v, %d refused",
		idle>>20, peak>>20, (peak-idle)>>20, bound>>20, ok.Load(), reasons, limited.Load())
	if peak-idle > bound {
		t.Fatalf("daemon RSS grew by %d MiB under the attack, over the documented bound of %d MiB", (peak-idle)>>20, bound>>20)
	}
}
