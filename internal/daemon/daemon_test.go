package daemon

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A state dir or work root under /tmp is refused at start, naming the setting, before
// anything is made: each lease's private /tmp would hide it from the lease.
func TestStartRefusesDirsUnderTmp(t *testing.T) {
	outside, err := os.MkdirTemp("/var/tmp", "sidecar-daemon-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(outside) })
	for _, c := range []struct {
		name, state, work, setting string
	}{
		{"state dir", filepath.Join(os.TempDir(), "sidecar-state-under-tmp"), filepath.Join(outside, "leases"), "SIDECAR_STATE_DIR"},
		{"work root", filepath.Join(outside, "state"), filepath.Join(os.TempDir(), "sidecar-work-under-tmp"), "SIDECAR_WORK_ROOT"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if !strings.HasPrefix(c.state, "/tmp/") && !strings.HasPrefix(c.work, "/tmp/") {
				t.Skip("TMPDIR is not /tmp")
			}
			_, err := Start(context.Background(), Config{
				SharedToken: strings.Repeat("s", 32),
				StateDir:    c.state,
				WorkRoot:    c.work,
				Isolation:   "strict",
			})
			if err == nil || !strings.Contains(err.Error(), c.setting) || !strings.Contains(err.Error(), "/tmp") {
				t.Fatalf("Start: %v, want a refusal naming %s", err, c.setting)
			}
			for _, d := range []string{c.state, c.work} {
				if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s exists after a refused start (%v)", d, err)
				}
			}
		})
	}
}
