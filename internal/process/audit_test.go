package process

import (
	"context"
	"encoding/json"
	"github.com/sidecar-sandbox/sidecar/internal/testtool"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestAuditArgv(t *testing.T) {
	if s, cut := auditArgv([]string{"sh", "-c", "echo hi"}); s != "sh -c echo hi" || cut {
		t.Errorf("short: %q %v", s, cut)
	}
	long := strings.Repeat("a", AuditArgvBytes-1) + "é" // the 2-byte rune straddles the cut
	if s, cut := auditArgv([]string{long}); s != long[:AuditArgvBytes-1] || !cut {
		t.Errorf("long: %d bytes %v", len(s), cut)
	}
}

// auditLines are the audit records logged so far.
func auditLines(t *testing.T, logs *testtool.Buffer) []map[string]any {
	t.Helper()
	var recs []map[string]any
	for line := range strings.SplitSeq(strings.TrimSpace(logs.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("%v: %s", err, line)
		}
		if rec["audit"] == true {
			recs = append(recs, rec)
		}
	}
	return recs
}

// fakeClock is a clock the test moves.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// Every exec and background process of a lease is in the log with its command line,
// exit code and duration, up to the lease's bucket; what the bucket drops is counted on
// the next line, and on a last line at release.
func TestAuditLinesRateLimitedPerLease(t *testing.T) {
	var logs testtool.Buffer
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	m := newManager(t, Config{Logger: slog.New(slog.NewJSONHandler(&logs, nil)), Now: clock.now}, "other")
	ctx := context.Background()
	exec := func(lease string, argv ...string) {
		t.Helper()
		if _, err := m.Exec(ctx, lease, ExecRequest{Spec: Spec{Argv: argv}}); err != nil {
			t.Fatal(err)
		}
	}
	for range AuditBurst + 5 {
		exec("lease", "true")
	}
	exec("other", "sh", "-c", "exit 3") // another lease has a bucket of its own
	recs := auditLines(t, &logs)
	if len(recs) != AuditBurst+1 {
		t.Fatalf("%d audit lines for %d execs in one lease and 1 in another, want %d", len(recs), AuditBurst+6, AuditBurst+1)
	}
	if r := recs[0]; r["msg"] != "exec" || r["lease"] != "lease" || r["argv"] != "true" || r["exit_code"] != 0.0 || r["duration_ms"] == nil {
		t.Errorf("first line: %v", r)
	}
	if r := recs[AuditBurst]; r["lease"] != "other" || r["argv"] != "sh -c exit 3" || r["exit_code"] != 3.0 {
		t.Errorf("other lease's line: %v", r)
	}

	clock.add(time.Second) // one token back
	exec("lease", "false")
	recs = auditLines(t, &logs)
	if r := recs[len(recs)-1]; r["argv"] != "false" || r["exit_code"] != 1.0 || r["audit_dropped"] != 5.0 {
		t.Fatalf("the line after the drops: %v, want audit_dropped 5", r)
	}
	if n := m.AuditLinesDropped(); n != 5 {
		t.Fatalf("AuditLinesDropped %d, want 5", n)
	}

	clock.add(10 * time.Second)
	long := "echo " + strings.Repeat("x", 200)
	p, _, err := m.Start(ctx, "lease", StartRequest{Spec: Spec{Argv: []string{"sh", "-c", long}}})
	if err != nil {
		t.Fatal(err)
	}
	<-p.Done()
	recs = auditLines(t, &logs)
	started, ended := recs[len(recs)-2], recs[len(recs)-1]
	if started["msg"] != "process started" || started["pid"] != p.ID() || started["argv_truncated"] != true || len(started["argv"].(string)) != AuditArgvBytes {
		t.Errorf("start line: %v", started)
	}
	if ended["msg"] != "process ended" || ended["pid"] != p.ID() || ended["exit_code"] != 0.0 || ended["duration_ms"] == nil {
		t.Errorf("end line: %v", ended)
	}

	for range AuditBurst + 2 { // spends the rest of the bucket, then drops
		exec("lease", "true")
	}
	before := len(auditLines(t, &logs))
	m.ReleaseLease("lease")
	recs = auditLines(t, &logs)
	if len(recs) != before+1 || recs[before]["msg"] != "audit lines dropped" || recs[before]["audit_dropped"].(float64) < 2 {
		t.Fatalf("release: %v", recs[before:])
	}
}
