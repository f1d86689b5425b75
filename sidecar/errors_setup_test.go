package sidecar

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/process"
	"github.com/sidecar-sandbox/sidecar/internal/sandbox"
)

// A sandbox setup failure is its own code, naming the step; the helper's report (host
// paths) stays in the log.
func TestHandlerSetupErrorProblem(t *testing.T) {
	err := fmt.Errorf("%w: %w", process.ErrStart, &sandbox.SetupError{Step: "join cgroup", Msg: "setup: join cgroup: open /sys/fs/cgroup/pids/x/cgroup.procs: no such file or directory"})
	p := problemOf(err)
	if p.Status != http.StatusInternalServerError || p.Code != apitype.CodeSandboxSetupFailed ||
		!strings.Contains(p.Detail, `"join cgroup"`) || strings.Contains(p.Detail, "/sys") {
		t.Fatalf("problem %+v", p)
	}
}

// A command that cannot be forked for want of a process slot (cgroup v2 clones it into
// the lease's cgroup, whose pids limit its leftovers may hold) is the lease's limit, not
// a daemon fault.
func TestHandlerNoProcessSlotProblem(t *testing.T) {
	err := fmt.Errorf("%w: %w", process.ErrStart, &os.PathError{Op: "fork/exec", Path: "/srv/sidecar/bin/sidecar-init", Err: syscall.EAGAIN})
	p := problemOf(err)
	if p.Status != http.StatusTooManyRequests || p.Code != apitype.CodeLeaseLimit || strings.Contains(p.Detail, "/srv") {
		t.Fatalf("problem %+v", p)
	}
}
