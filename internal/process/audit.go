package process

import (
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// The audit lines: one per run-to-completion exec when it ends, and one when a background
// process starts and when it ends, each with `"audit": true` and the lease, so an operator
// can see what ran in a lease. A lease that runs commands in a tight loop must not flood
// the log: each lease has a token bucket of AuditBurst lines refilled at AuditRate per
// second; a line beyond it is dropped and counted, and the next line logged for the lease
// carries the count (audit_dropped), as does a last line when the lease is released.
const (
	AuditBurst = 60
	AuditRate  = 1.0 // lines per second per lease, once the burst is spent
	// AuditArgvBytes is how much of the command line (argv joined by spaces) a line holds.
	AuditArgvBytes = 128
)

// auditor rate-limits the audit lines of every lease.
type auditor struct {
	log *slog.Logger
	now func() time.Time

	dropped atomic.Int64 // every lease's, for sidecar_audit_lines_dropped_total

	mu      sync.Mutex
	buckets map[string]*auditBucket
	pruneAt int // the map's size at which full, idle buckets are dropped
}

type auditBucket struct {
	tokens  float64
	at      time.Time // when tokens was last brought up to date
	dropped int64     // lines dropped since the last one logged
}

func newAuditor(log *slog.Logger, now func() time.Time) *auditor {
	return &auditor{log: log, now: now, buckets: map[string]*auditBucket{}, pruneAt: 64}
}

// line logs msg for lease with attrs, unless the lease's bucket is empty.
func (a *auditor) line(lease, msg string, attrs ...any) {
	dropped, ok := a.take(lease)
	if !ok {
		return
	}
	args := append([]any{"audit", true, "lease", lease}, attrs...)
	if dropped > 0 {
		args = append(args, "audit_dropped", dropped)
	}
	a.log.Info(msg, args...)
}

// take spends a token of lease's bucket: ok false when there is none (the line is
// counted as dropped); dropped is the count of lines dropped before this one.
func (a *auditor) take(lease string) (dropped int64, ok bool) {
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	b := a.buckets[lease]
	if b == nil {
		a.prune(now)
		b = &auditBucket{tokens: AuditBurst, at: now}
		a.buckets[lease] = b
	}
	b.refill(now)
	if b.tokens < 1 {
		b.dropped++
		a.dropped.Add(1)
		return 0, false
	}
	b.tokens--
	dropped, b.dropped = b.dropped, 0
	return dropped, true
}

func (b *auditBucket) refill(now time.Time) {
	if el := now.Sub(b.at); el > 0 {
		b.tokens = min(AuditBurst, b.tokens+el.Seconds()*AuditRate)
		b.at = now
	}
}

// prune drops, once the map has grown to pruneAt, the buckets that are full again and
// owe no count: a fresh bucket is the same. It bounds the map when a line comes after
// its lease was released (an exec killed by the release).
func (a *auditor) prune(now time.Time) {
	if len(a.buckets) < a.pruneAt {
		return
	}
	for lease, b := range a.buckets {
		if b.refill(now); b.tokens >= AuditBurst && b.dropped == 0 {
			delete(a.buckets, lease)
		}
	}
	a.pruneAt = max(64, 2*len(a.buckets))
}

// AuditLinesDropped is how many audit lines the per-lease buckets have dropped since the
// Manager was made.
func (m *Manager) AuditLinesDropped() int64 { return m.audit.dropped.Load() }

// forget ends a released lease's bucket, logging the lines it dropped since its last.
func (a *auditor) forget(lease string) {
	a.mu.Lock()
	b := a.buckets[lease]
	delete(a.buckets, lease)
	a.mu.Unlock()
	if b != nil && b.dropped > 0 {
		a.log.Info("audit lines dropped", "audit", true, "lease", lease, "audit_dropped", b.dropped)
	}
}

// auditArgv is argv joined by spaces, cut to AuditArgvBytes on a character boundary;
// truncated says whether it was cut.
func auditArgv(argv []string) (s string, truncated bool) {
	s = strings.Join(argv, " ")
	if len(s) <= AuditArgvBytes {
		return s, false
	}
	cut := AuditArgvBytes
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut], true
}

// argvAttrs are the argv attributes of an audit line.
func argvAttrs(argv []string) []any {
	s, truncated := auditArgv(argv)
	if truncated {
		return []any{"argv", s, "argv_truncated", true}
	}
	return []any{"argv", s}
}
