package sandbox

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/sidecar-sandbox/sidecar/internal/kernel/cgroupfs"
)

// children lists the child cgroups of a lease in every hierarchy that has them (v2's, or
// v1's memory and freezer), failing the test if those disagree or another v1 hierarchy
// (cpu, pids) has any.
func children(t *testing.T, s *Sandbox, leaseID string) []string {
	t.Helper()
	s.settle() // no child half made in some hierarchies (a spare, a launcher's)
	var first []string
	withChildren := []string{cgroupDir(s, "memory", leaseID), cgroupDir(s, "freezer", leaseID)}
	for i, dir := range withChildren {
		names, err := cgroupfs.Children(dir)
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(names)
		if i == 0 {
			first = names
		} else if !slices.Equal(names, first) {
			t.Fatalf("%s children %q, %s children %q", withChildren[0], first, dir, names)
		}
	}
	for _, dir := range cgroupDirs(s, leaseID) {
		if slices.Contains(withChildren, dir) {
			continue
		}
		if names, err := cgroupfs.Children(dir); err != nil || len(names) > 0 {
			t.Fatalf("%s children %q (%v), want none: commands stay in the lease's cgroup there", dir, names, err)
		}
	}
	return first
}

// Commands take spare child cgroups: made ahead, or emptied by the command before (kept
// for the next one instead of removed and made again); Close removes the spares and
// leaves the lease.
func TestChildCgroupsAheadAndBehind(t *testing.T) {
	s := newTestSandbox(t)
	l := newTestLease(t, s, nil)
	var prev string
	for i := range 5 {
		s.settle()
		launcher, _ := s.eng.Launcher(l.ID)
		spares := slices.DeleteFunc(children(t, s, l.ID), func(c string) bool {
			return c == launcher.Cgroup // the launcher's own
		})
		if i > 0 && (len(spares) < 1 || len(spares) > 2 || !slices.Contains(spares, prev)) {
			t.Fatalf("before command %d: children %q, want one or two spares, the last command's %s among them", i, spares, prev)
		}
		cmd, tr, err := s.Command(l.ID, Spec{Argv: []string{"true"}})
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout = new(strings.Builder) // not a file: the plain start, not the launcher
		if err := tr.Start(); err != nil {
			t.Fatal(err)
		}
		child := treeCgroup(tr)
		if i > 0 && !slices.Contains(spares, child) {
			t.Errorf("command %d in %s, not one of the spares %q", i, child, spares)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatal(err)
		}
		if err := tr.Close(); err != nil {
			t.Fatal(err)
		}
		prev = child
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if left := children(t, s, l.ID); len(left) != 0 {
		t.Errorf("after Close: children %q", left)
	}
	if _, err := os.Stat(cgroupDir(s, "memory", l.ID)); err != nil {
		t.Errorf("Close removed the lease's cgroup: %v", err)
	}
	// After Close commands still work, without spares, and clean up at once.
	if r := run(t, s, l.ID, sh("echo ok")); r.stdout != "ok\n" {
		t.Errorf("after Close: %+v", r)
	}
	if left := children(t, s, l.ID); len(left) != 0 {
		t.Errorf("after a command past Close: children %q", left)
	}
}

// Teardown right after a command, with spares still being made and the child still being
// removed, leaves no cgroup and reports no error.
func TestTeardownRacesBackgroundWork(t *testing.T) {
	s := newTestSandbox(t)
	for range 10 {
		l := newTestLease(t, s, nil)
		run(t, s, l.ID, Spec{Argv: []string{"true"}})
		if err := s.Teardown(context.Background(), l.ID); err != nil {
			t.Fatalf("Teardown: %v", err)
		}
		if err := s.Retire(context.Background(), l.ID); err != nil {
			t.Fatalf("Retire: %v", err)
		}
		for _, dir := range cgroupDirs(s, l.ID) {
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Fatalf("lease cgroup %s still there (%v)", dir, err)
			}
		}
	}
}
