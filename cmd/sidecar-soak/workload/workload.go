// Package workload is the lease life that the soak (cmd/sidecar-soak) and the short load
// test in CI (internal/daemon/fault_load_test.go) both run, so that the two measure the same thing.
package workload

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// Round is one lease's life: acquire, exec, write, resumable upload, read both back, a
// background process watched to its end, release. It returns each call's latency.
func Round(ctx context.Context, c *client.Client, session string, ttl time.Duration, payload []byte) ([]time.Duration, error) {
	var lat []time.Duration
	timed := func(f func() error) error {
		start := time.Now()
		err := f()
		lat = append(lat, time.Since(start))
		return err
	}
	var l *client.Lease
	if err := timed(func() (err error) {
		l, err = c.Acquire(ctx, apitype.AcquireRequest{SessionID: session, TTLSeconds: int64(ttl / time.Second)})
		return err
	}); err != nil {
		return lat, fmt.Errorf("acquire: %w", err)
	}
	released := false
	defer func() {
		if !released {
			_ = l.Release(context.WithoutCancel(ctx))
		}
	}()
	steps := []struct {
		name string
		f    func() error
	}{
		{"exec", func() error {
			r, err := l.Exec(ctx, apitype.ExecRequest{Argv: []string{"sh", "-c", "echo hi; echo err >&2"}})
			if err == nil && (r.Stdout != "hi\n" || r.Stderr != "err\n" || r.ExitCode != 0) {
				err = fmt.Errorf("result %+v", r)
			}
			return err
		}},
		{"write", func() error { return l.WriteFile(ctx, "a.bin", payload, 0o644) }},
		{"upload", func() error {
			return l.Upload(ctx, "dir/b.bin", bytes.NewReader(payload), int64(len(payload)), client.UploadOptions{MkdirAll: true})
		}},
		{"read", func() error {
			for _, p := range []string{"a.bin", "dir/b.bin"} {
				got, err := l.ReadFile(ctx, p)
				if err != nil {
					return err
				}
				if !bytes.Equal(got, payload) {
					return fmt.Errorf("%s differs from what was written", p)
				}
			}
			return nil
		}},
		{"process", func() error {
			p, err := l.Start(ctx, apitype.StartRequest{ID: "bg", Argv: []string{"sh", "-c", "seq 1 2000; exit 7"}})
			if err != nil {
				return err
			}
			out, err := io.ReadAll(p.Stdout)
			if err != nil {
				return err
			}
			st, err := p.Wait(ctx)
			if err == nil && (st.ExitCode != 7 || strings.Count(string(out), "\n") != 2000) {
				err = fmt.Errorf("status %+v, %d bytes of output", st, len(out))
			}
			return err
		}},
		{"release", func() error { released = true; return l.Release(ctx) }},
	}
	for _, s := range steps {
		if err := timed(s.f); err != nil {
			return lat, fmt.Errorf("%s: %w", s.name, err)
		}
	}
	return lat, nil
}

// ProcsOfUIDs lists the pids whose real uid lies in [first, last] (none for 0): what is
// left of lease processes after a run.
func ProcsOfUIDs(first, last int) []string {
	if first == 0 {
		return nil
	}
	entries, _ := os.ReadDir("/proc")
	var found []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		status, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(status), "\n") {
			if f := strings.Fields(line); len(f) > 1 && f[0] == "Uid:" {
				if uid, _ := strconv.Atoi(f[1]); uid >= first && uid <= last {
					found = append(found, e.Name())
				}
			}
		}
	}
	return found
}
