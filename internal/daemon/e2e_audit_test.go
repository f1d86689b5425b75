package daemon_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/daemon"
)

// lockedLog is a daemon's log, read by the test while the daemon writes it.
type lockedLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// find returns the first record whose msg is msg and whose fields include want.
func (l *lockedLog) find(t *testing.T, msg string, want map[string]any) map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
next:
	for line := range strings.SplitSeq(l.buf.String(), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil || rec["msg"] != msg {
			continue
		}
		for k, v := range want {
			if rec[k] != v {
				continue next
			}
		}
		return rec
	}
	return nil
}

// An operator sees in the daemon's log what ran in a lease: each exec with its command
// line, exit code and duration, and each background process's start and end.
func TestAuditLogOfExecsAndProcesses(t *testing.T) {
	var logs lockedLog
	d := startDaemon(t, func(c *daemon.Config) {
		c.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	})
	l := d.acquire("audit")
	ctx := context.Background()
	must(l.Exec(ctx, sh(`exit 7`)))(t)
	p := must(l.Start(ctx, apitype.StartRequest{Argv: []string{"/bin/sh", "-c", "exit 3"}}))(t)
	must(p.Wait(ctx))(t)

	audit := map[string]any{"audit": true, "lease": l.ID()}
	with := func(kv ...any) map[string]any {
		m := map[string]any{}
		for k, v := range audit {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	if r := logs.find(t, "exec", with("argv", "/bin/sh -c exit 7", "exit_code", 7.0)); r == nil || r["duration_ms"] == nil {
		t.Errorf("no audit line for the exec: %v", r)
	}
	if r := logs.find(t, "process started", with("pid", p.ID(), "argv", "/bin/sh -c exit 3")); r == nil {
		t.Error("no audit line for the process's start")
	}
	if _, _, metrics := d.raw("GET", "/metrics", testToken, nil, nil); !strings.Contains(string(metrics), "\nsidecar_audit_lines_dropped_total 0\n") {
		t.Error("/metrics has no sidecar_audit_lines_dropped_total at 0")
	}
	if r := logs.find(t, "process ended", with("pid", p.ID(), "exit_code", 3.0)); r == nil || r["duration_ms"] == nil {
		t.Errorf("no audit line for the process's end: %v", r)
	}
}
