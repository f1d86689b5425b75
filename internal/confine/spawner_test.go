package confine

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sidecar-sandbox/sidecar/internal/testtool"
)

// cHelper builds cmd/sidecar-init as `make build` does, once per test, or takes the one
// the VM tests ship (they boot without a compiler).
func cHelper(t *testing.T) string {
	t.Helper()
	if dir := os.Getenv("SIDECAR_TEST_PREBUILT"); dir != "" {
		return filepath.Join(dir, "sidecar-init")
	}
	cc := testtool.Need(t, "cc", "gcc", "it builds cmd/sidecar-init/sidecar-init.c")
	path := filepath.Join(t.TempDir(), "sidecar-init")
	if out, err := exec.Command(cc, "-O2", "-static", "-Wall", "-Wextra", "-Werror", "-o", path, "../../cmd/sidecar-init/sidecar-init.c").CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	return path
}

// spawnFacts starts, in cell id, a helper without standard streams whose target writes
// what it sees to a file, and returns those lines: its pid, parent, session, directory, mount
// namespace and cgroups.
func spawnFacts(t *testing.T, e *Engine, id string, newNS bool) (facts []string, pid int, dir string) {
	t.Helper()
	dir = t.TempDir()
	out := filepath.Join(dir, "facts")
	st := Start{Dir: dir, NewNS: newNS}
	st.Config.Argv = []string{"/bin/sh", "-c", `{ echo $$; cut -d' ' -f4,6 /proc/$$/stat; pwd; readlink /proc/self/ns/mnt; cat /proc/self/cgroup; } > ` + out}
	st.Config.Env, st.Config.Dir = []string{"PATH=/usr/bin:/bin"}, dir
	cmd, tr, err := e.Command(id, st)
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Start(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n"), cmd.Process.Pid, dir
}

// A helper the spawner starts is the one the daemon would have started: its child (the
// pid the daemon waits for), in a session of its own, in its directory and child
// cgroup, in the daemon's mount namespace or a copy of it; its descriptors are where the
// helper reads them (else it could not read its config). A spawner that is gone leaves
// the start to the daemon.
func TestSpawnerStartsHelpersAsTheDaemonWould(t *testing.T) {
	id := "t-spawner"
	e := newTestEngine(t, id)
	helper := cHelper(t)
	s, err := startSpawner(helper, "__sandbox-init")
	if err != nil {
		t.Fatal(err)
	}
	e.helper, e.helperArg, e.forks, e.spawner = helper, "__sandbox-init", true, s
	ownNS, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	// A helper born in its cgroup (v2, clone3 allowed) is the daemon's to start.
	want := int64(1)
	if e.cg.ChildDir(id, "p") != "" {
		want = 0
	}
	for _, newNS := range []bool{false, true} {
		before := s.started.Load()
		facts, pid, dir := spawnFacts(t, e, id, newNS)
		if got := s.started.Load() - before; got != want {
			t.Fatalf("newNS %v: the spawner started %d helpers, want %d", newNS, got, want)
		}
		if len(facts) < 5 {
			t.Fatalf("newNS %v: facts %q", newNS, facts)
		}
		if facts[0] != strconv.Itoa(pid) {
			t.Errorf("newNS %v: target pid %s, the daemon waited for %d", newNS, facts[0], pid)
		}
		if want := strconv.Itoa(os.Getpid()) + " " + facts[0]; facts[1] != want {
			t.Errorf("newNS %v: parent and session %q, want %q (the daemon's child, its own session)", newNS, facts[1], want)
		}
		if facts[2] != dir {
			t.Errorf("newNS %v: directory %q, want %q", newNS, facts[2], dir)
		}
		if (facts[3] != ownNS) == !newNS {
			t.Errorf("newNS %v: mount namespace %s, the daemon's %s", newNS, facts[3], ownNS)
		}
		if cg := strings.Join(facts[4:], "\n"); !strings.Contains(cg, "/"+testCgroupParent+"/"+id+"/p") {
			t.Errorf("newNS %v: not in a child cgroup of its cell:\n%s", newNS, cg)
		}
	}

	s.close() // gone: the daemon starts helpers itself
	before := s.started.Load()
	if facts, _, _ := spawnFacts(t, e, id, false); len(facts) < 2 || facts[1] != strconv.Itoa(os.Getpid())+" "+facts[0] {
		t.Errorf("without the spawner: facts %q", facts)
	}
	if s.started.Load() != before {
		t.Error("a closed spawner started a helper")
	}
}

// The spawner starts nothing on a request it cannot hold to the protocol: it exits, and
// the engine starts helpers itself from then on.
func TestSpawnerRefusesBadRequests(t *testing.T) {
	helper := cHelper(t)
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer devNull.Close()
	null := int(devNull.Fd())
	for name, req := range map[string]struct {
		msg []byte
		fds []int
	}{
		"no slots":           {[]byte("s\x00\x00/"), nil},
		"too many slots":     {append([]byte("s\x00\x17"), append([]byte(strings.Repeat("0", 23)), '/')...), nil},
		"unknown flag":       {[]byte("s\x04\x01" + "1/"), []int{null}},
		"fewer descriptors":  {[]byte("s\x00\x02" + "11/"), []int{null}},
		"more descriptors":   {[]byte("s\x00\x01" + "1/"), []int{null, null}},
		"cgroup flag":        {[]byte("s\x02\x01" + "1/"), []int{null, null}},
		"bad slot mark":      {[]byte("s\x00\x01" + "x/"), nil},
		"relative directory": {[]byte("s\x00\x01" + "1tmp"), []int{null}},
		"no directory":       {[]byte("s\x00\x01" + "1"), []int{null}},
		"NUL in directory":   {[]byte("s\x00\x01" + "1/tmp\x00x"), []int{null}},
		"unknown request":    {[]byte("z\x00\x01" + "1/"), []int{null}},
	} {
		s, err := startSpawner(helper, "__sandbox-init")
		if err != nil {
			t.Fatal(err)
		}
		pid, pidfd, err := s.request(req.msg, req.fds)
		if err == nil {
			unix.Close(pidfd)
			t.Errorf("%s: spawned %d", name, pid)
		} else if !errors.Is(err, errSpawner) || !strings.Contains(err.Error(), "exited") {
			t.Errorf("%s: %v, want the spawner gone", name, err)
		}
		s.close()
	}
}

// BenchmarkHelperStart starts the C helper running /bin/true, by the daemon itself and by
// the spawner, while the daemon holds extra descriptors (nine per lease: 900 at 100, 9,000 at 1,000
// leases), each of which a helper the daemon forks copies and then closes in its execve.
func BenchmarkHelperStart(b *testing.B) {
	helper := os.Getenv("SIDECAR_BENCH_HELPER") // cmd/sidecar-init, built
	if helper == "" {
		b.Skip("SIDECAR_BENCH_HELPER: the path of a built sidecar-init")
	}
	for _, held := range []int{0, 900, 9000} {
		var files []*os.File
		for len(files) < held {
			r, w, err := os.Pipe()
			if err != nil {
				b.Fatal(err)
			}
			files = append(files, r, w)
		}
		for _, via := range []string{"daemon", "spawner"} {
			b.Run(fmt.Sprintf("fds=%d/%s", held, via), func(b *testing.B) {
				e := NewEngine(EngineConfig{Helper: helper, HelperArg: "__sandbox-init", Forks: via == "spawner"})
				defer e.Close()
				st := Start{Dir: "/"}
				st.Config.Argv, st.Config.Dir = []string{"/bin/true"}, "/"
				for b.Loop() {
					cmd, tr, err := e.Command("", st)
					if err != nil {
						b.Fatal(err)
					}
					if err := tr.Start(); err != nil {
						b.Fatal(err)
					}
					if err := cmd.Wait(); err != nil {
						b.Fatal(err)
					}
					tr.Close()
				}
			})
		}
		closeAll(files)
	}
}
