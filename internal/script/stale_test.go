package script

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

func TestCleanupStale(t *testing.T) {
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	deadPID, livePID := dead.Process.Pid, os.Getpid()

	tmp := t.TempDir()
	var want []string
	for _, name := range []string{
		fmt.Sprintf("sidecar-script-root-%d-1", deadPID),
		fmt.Sprintf("sidecar-script-cache-%d-2", deadPID),
		fmt.Sprintf("sidecar-script-root-%d-3", livePID),
		"sidecar-script-root-notapid-4",
		"unrelated",
	} {
		if err := os.Mkdir(filepath.Join(tmp, name), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	want = append(want, filepath.Join(tmp, fmt.Sprintf("sidecar-script-cache-%d-2", deadPID)),
		filepath.Join(tmp, fmt.Sprintf("sidecar-script-root-%d-1", deadPID)))

	removed, err := CleanupStale(tmp)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	slices.Sort(want)
	if !slices.Equal(removed, want) {
		t.Errorf("removed %q, want %q", removed, want)
	}
	for _, p := range want {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s still there", p)
		}
	}
	if _, err := os.Stat(filepath.Join(tmp, fmt.Sprintf("sidecar-script-root-%d-3", livePID))); err != nil {
		t.Error("a live daemon's root was removed")
	}
}
