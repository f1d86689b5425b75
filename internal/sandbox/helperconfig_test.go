package sandbox

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sidecar-sandbox/sidecar/internal/confine/initproc"
	"github.com/sidecar-sandbox/sidecar/internal/kernel/landlock"
	"github.com/sidecar-sandbox/sidecar/internal/kernel/seccomp"
	"github.com/sidecar-sandbox/sidecar/internal/testtool"
)

// badConfigs are configs both helpers must refuse at the config stage (exit 125).
var badConfigs = map[string]string{
	"empty":                 "",
	"no magic":              "argv\x00true\x00uid\x000\x00gid\x000\x00",
	"wrong magic":           "sidecar-init/2\x00argv\x00true\x00uid\x000\x00gid\x000\x00",
	"not NUL-terminated":    "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000",
	"key without value":     "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00dir\x00",
	"unknown key":           "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00colour\x00blue\x00",
	"seccomp 1":             "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00seccomp\x001\x00",
	"seccomp empty":         "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00seccomp\x00\x00",
	"seccomp uppercase":     "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00seccomp\x000600000000007FFF\x00",
	"seccomp not hex":       "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00seccomp\x000600000000007fgf\x00",
	"seccomp half insn":     "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00seccomp\x000600000000007fff06000000\x00",
	"seccomp twice":         "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00seccomp\x000600000000007fff\x00seccomp\x000600000000007fff\x00",
	"seccomp too long":      "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00seccomp\x00" + strings.Repeat("0600000000007fff", unix.BPF_MAXINSNS+1) + "\x00",
	"unknown rlimit":        "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00rlimit_fsize\x001\x00",
	"rlimit prefix only":    "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00rlimit_\x001\x00",
	"rlimit twice":          "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00rlimit_core\x000\x00rlimit_core\x000\x00",
	"rlimit negative":       "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00rlimit_nofile\x00-1\x00",
	"pts_dir twice":         "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00pts_dir\x00/p\x00pts_dir\x00/p\x00",
	"passwd twice":          "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00passwd\x00/p\x00passwd\x00/p\x00",
	"group twice":           "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00group\x00/g\x00group\x00/g\x00",
	"work_dir twice":        "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00work_dir\x00/w\x00work_dir\x00/w\x00",
	"root twice":            "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00root\x00/r\x00root\x00/r\x00",
	"home twice":            "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00home\x00/h\x00home\x00/h\x00",
	"uid twice":             "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00uid\x001\x00",
	"userns without uid":    "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x007\x00userns\x001\x00",
	"userns without gid":    "sidecar-init/1\x00argv\x00true\x00uid\x007\x00gid\x000\x00userns\x001\x00",
	"userns 0":              "sidecar-init/1\x00argv\x00true\x00uid\x007\x00gid\x007\x00userns\x000\x00",
	"userns twice":          "sidecar-init/1\x00argv\x00true\x00uid\x007\x00gid\x007\x00userns\x001\x00userns\x001\x00",
	"dir twice":             "sidecar-init/1\x00argv\x00true\x00dir\x00/\x00dir\x00/\x00uid\x000\x00gid\x000\x00",
	"no uid":                "sidecar-init/1\x00argv\x00true\x00gid\x000\x00",
	"no gid":                "sidecar-init/1\x00argv\x00true\x00uid\x000\x00",
	"negative uid":          "sidecar-init/1\x00argv\x00true\x00uid\x00-1\x00gid\x000\x00",
	"uid with sign":         "sidecar-init/1\x00argv\x00true\x00uid\x00+1\x00gid\x000\x00",
	"uid 2^31":              "sidecar-init/1\x00argv\x00true\x00uid\x002147483648\x00gid\x000\x00",
	"uid 11 digits":         "sidecar-init/1\x00argv\x00true\x00uid\x0000000000001\x00gid\x000\x00",
	"uid not a number":      "sidecar-init/1\x00argv\x00true\x00uid\x001a\x00gid\x000\x00",
	"empty uid":             "sidecar-init/1\x00argv\x00true\x00uid\x00\x00gid\x000\x00",
	"netns not 1":           "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00netns\x00yes\x00",
	"rules without policy":  "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00ll_rw\x00/\x00",
	"landlock twice":        "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00landlock\x000\x00landlock\x000\x00",
	"max abi, no policy":    "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00landlock_max_abi\x003\x00",
	"max abi twice":         "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00landlock\x000\x00landlock_max_abi\x003\x00landlock_max_abi\x003\x00",
	"max abi not a number":  "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00landlock\x000\x00landlock_max_abi\x00x\x00",
	"no argv":               "sidecar-init/1\x00uid\x000\x00gid\x000\x00",
	"empty argv0":           "sidecar-init/1\x00argv\x00\x00uid\x000\x00gid\x000\x00",
	"magic only":            "sidecar-init/1\x00",
	"mountns not 1":         "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00detach\x00/s\x00mountns\x00yes\x00",
	"mountns twice":         "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00detach\x00/s\x00mountns\x001\x00mountns\x001\x00",
	"tree without mountns":  "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00detach\x00/s\x00tree\x00/s/a\x00",
	"tree is a detach root": "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00detach\x00/s\x00mountns\x001\x00tree\x00/s\x00",
	"tree with ..":          "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00detach\x00/s\x00mountns\x001\x00tree\x00/s/../etc\x00",
	"tree with .":           "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00detach\x00/s\x00mountns\x001\x00tree\x00/s/./a\x00",
	"tree with //":          "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00detach\x00/s\x00mountns\x001\x00tree\x00/s//a\x00",
	"tree with a final /":   "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00detach\x00/s\x00mountns\x001\x00tree\x00/s/a/\x00",
	"tree is /":             "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00detach\x00/s\x00mountns\x001\x00tree\x00/\x00",
	"tree outside detach":   "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00detach\x00/s\x00mountns\x001\x00tree\x00/t/a\x00",
	"tree relative":         "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00detach\x00/s\x00mountns\x001\x00tree\x00s/a\x00",
	"tree under a tree":     "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00detach\x00/s\x00mountns\x001\x00tree\x00/s/a\x00tree\x00/s/a/b\x00",
	"tree twice":            "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00detach\x00/s\x00mountns\x001\x00tree\x00/s/a\x00tree\x00/s/a\x00",
	"17 trees":              "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00detach\x00/s\x00mountns\x001\x00" + seventeenTrees,
	"too large":             "sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00env\x00" + strings.Repeat("x", initproc.MaxConfigSize) + "\x00",
}

// seventeenTrees is one more "tree" than initproc.MaxTrees allows.
var seventeenTrees = func() string {
	var b strings.Builder
	for i := range initproc.MaxTrees + 1 {
		fmt.Fprintf(&b, "tree\x00/s/%d\x00", i)
	}
	return b.String()
}()

type helperRun struct {
	code                   int
	report, stdout, stderr string
}

// runHelper starts helper directly with config on fd 3 (sealed when seal is set) and the
// report pipe on fd 4, as Command does, and waits for it. It needs no root: the configs
// here drop no privileges.
func runHelper(t *testing.T, helper string, config []byte, seal bool) helperRun {
	t.Helper()
	return runHelperEnv(t, helper, config, seal, []string{})
}

func runHelperEnv(t *testing.T, helper string, config []byte, seal bool, env []string) helperRun {
	t.Helper()
	fd, err := unix.MemfdCreate("test-config", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	mem := os.NewFile(uintptr(fd), "config")
	defer mem.Close()
	if _, err := mem.Write(config); err != nil {
		t.Fatal(err)
	}
	if _, err := mem.Seek(0, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	if seal {
		if _, err := unix.FcntlInt(mem.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_WRITE|unix.F_SEAL_GROW|unix.F_SEAL_SHRINK|unix.F_SEAL_SEAL); err != nil {
			t.Fatal(err)
		}
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var stdout, stderr bytes.Buffer
	cmd := &exec.Cmd{Path: helper, Args: []string{helper, HelperArg}, Env: env,
		ExtraFiles: []*os.File{mem, w}, Stdout: &stdout, Stderr: &stderr}
	err = cmd.Start()
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	report, _ := io.ReadAll(io.LimitReader(r, 4096))
	err = cmd.Wait()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	return helperRun{cmd.ProcessState.ExitCode(), string(report), stdout.String(), stderr.String()}
}

func helperConfig(t *testing.T, cfg initproc.Config) []byte {
	t.Helper()
	b, err := initproc.Encode(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Both helpers refuse the same malformed configs the same way, and agree with
// initproc.Decode: one protocol, two interchangeable readers.
func TestHelpersRefuseBadConfigs(t *testing.T) {
	valid := helperConfig(t, initproc.Config{Argv: []string{"/bin/echo", "ok"}})
	for _, h := range testHelpers {
		t.Run(h.name, func(t *testing.T) {
			helper := h.usable(t)
			for name, config := range badConfigs {
				if _, err := initproc.Decode([]byte(config)); err == nil {
					t.Errorf("%s: Decode accepted it", name)
				}
				r := runHelper(t, helper, []byte(config), true)
				if r.code != initproc.ExitSetup || !strings.HasPrefix(r.report, "125 config: ") ||
					!strings.HasPrefix(r.stderr, "sidecar-init: config: ") || r.stdout != "" {
					t.Errorf("%s: %+v; want exit 125 with a config report", name, r)
				}
			}
			if r := runHelper(t, helper, valid, false); r.code != initproc.ExitSetup || !strings.Contains(r.report, "not sealed") {
				t.Errorf("unsealed config: %+v; want exit 125, not sealed", r)
			}
			if r := runHelper(t, helper, valid, true); r.code != 0 || r.stdout != "ok\n" || r.report != "" {
				t.Errorf("valid config: %+v; want ok", r)
			}
		})
	}
}

// Both helpers load the filter program their config carries, as it is: one that refuses
// execve(2) alone leaves the helper unable to start its target, and nothing else.
func TestHelpersLoadTheGivenFilter(t *testing.T) {
	refuseExec := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 0}, // the system call number
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 1, K: unix.SYS_EXECVE},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW},
	}
	for _, h := range testHelpers {
		t.Run(h.name, func(t *testing.T) {
			helper := h.usable(t)
			echo := initproc.Config{Argv: []string{"/bin/echo", "ran"}}
			if r := runHelper(t, helper, helperConfig(t, echo), true); r.code != 0 || r.stdout != "ran\n" {
				t.Fatalf("without a filter: %+v", r)
			}
			echo.Seccomp = refuseExec
			r := runHelper(t, helper, helperConfig(t, echo), true)
			if r.code != initproc.ExitCannotExec || r.stdout != "" || !strings.Contains(strings.ToLower(r.report), "operation not permitted") {
				t.Errorf("under a filter refusing execve: %+v; want exit 126, operation not permitted", r)
			}
		})
	}
}

// Both helpers set the configured limits, and refuse to bind a devpts instance, a user
// database or the workdir outside a private mount namespace (before any mount: this runs
// in the test's own namespace).
func TestHelpersSetup(t *testing.T) {
	for _, h := range testHelpers {
		t.Run(h.name, func(t *testing.T) {
			helper := h.usable(t)
			cfg := initproc.Config{Argv: []string{"/bin/sh", "-c", "ulimit -n; ulimit -Hc"},
				Rlimits: []initproc.Rlimit{{Name: "nofile", Value: 100}, {Name: "core", Value: 0}}}
			if r := runHelper(t, helper, helperConfig(t, cfg), true); r.code != 0 || r.stdout != "100\n0\n" {
				t.Errorf("rlimits: %+v; want 100 and 0", r)
			}
			for dst, cfg := range map[string]initproc.Config{
				"/dev/pts":         {Argv: []string{"true"}, PTSDir: "/nonexistent"},
				"/etc/passwd":      {Argv: []string{"true"}, Passwd: "/nonexistent"},
				"/etc/group":       {Argv: []string{"true"}, Group: "/nonexistent"},
				"/etc/resolv.conf": {Argv: []string{"true"}, Resolv: "/nonexistent"},
				"/workspace":       {Argv: []string{"true"}, WorkDir: "/nonexistent"},
				"/nonexistent":     {Argv: []string{"true"}, Root: "/nonexistent"},
			} {
				if r := runHelper(t, helper, helperConfig(t, cfg), true); r.code != initproc.ExitSetup ||
					r.report != "125 setup: refusing to mount "+dst+": not in a private mount namespace" {
					t.Errorf("a bind on %s without a private namespace: %+v", dst, r)
				}
			}
		})
	}
}

// Exec failures: the same codes and reports from both helpers (like a shell's 126/127).
func TestHelpersExecErrors(t *testing.T) {
	for _, h := range testHelpers {
		t.Run(h.name, func(t *testing.T) {
			helper := h.usable(t)
			for _, tc := range []struct {
				argv   []string
				env    []string
				code   int
				report string
			}{
				{[]string{"no-such-program-xyz"}, nil, 127, "127 exec: no-such-program-xyz: executable file not found in $PATH"},
				{[]string{"/no/such/program"}, nil, 127, "127 exec: /no/such/program: "},
				{[]string{"/etc/passwd"}, nil, 126, "126 exec: /etc/passwd: "},
				{[]string{"passwd"}, []string{"PATH=relative:/etc"}, 126, "126 exec: passwd: "},
				{[]string{"echo"}, []string{"PATH=.:bin:/nonexistent"}, 127, "127 exec: echo: executable file not found in $PATH"},
				{[]string{"echo", "found"}, []string{"PATH=/nonexistent::/bin"}, 0, ""},
				{[]string{"x"}, []string{"PATH=/" + strings.Repeat("d", 5000)}, 126, "126 exec: x: "},
			} {
				r := runHelper(t, helper, helperConfig(t, initproc.Config{Argv: tc.argv, Env: tc.env}), true)
				if r.code != tc.code || !strings.HasPrefix(r.report, tc.report) || (tc.report == "") != (r.report == "") {
					t.Errorf("%q with %q: %+v; want exit %d, report %q", tc.argv, tc.env, r, tc.code, tc.report)
				}
			}
		})
	}
}

// FuzzHelperConfigParity: the C parser accepts exactly what initproc.Decode accepts and
// survives any input, under AddressSanitizer and UndefinedBehaviorSanitizer where the
// compiler has them. It runs a parse-only build of the C helper that exits once the config
// is parsed, so no fuzzed path, uid or argv is ever used.
func FuzzHelperConfigParity(f *testing.F) {
	parser := buildParseOnlyHelper(f)
	for _, b := range badConfigs {
		f.Add([]byte(b))
	}
	full, err := initproc.Encode(&initproc.Config{
		Argv: []string{"/bin/sh", "-c", "x", ""}, Env: []string{"PATH=/bin"}, Dir: "/w", UID: 7, GID: 8,
		CgroupProcs: []string{"/c/cgroup.procs"}, TmpDir: "/t", HostMountNS: "mnt:[1]", PTSDir: "/p", NetNS: true,
		Passwd: "/u/passwd", Group: "/u/group", Resolv: "/u/resolv.conf", Home: "/l/home", WorkDir: "/l/work", Root: "/l/root/merged",
		Detach: []string{"/s", "/w"}, MountNS: true, Trees: []string{"/s/a", "/s/ab", "/w/b/c"},
		Landlock: &initproc.Landlock{MinABI: 6, MaxABI: 7, RW: []string{"/w"}, RX: []string{"/usr"}, RO: []string{"/etc"}, Dev: []string{"/dev/null"}},
		Rlimits:  []initproc.Rlimit{{Name: "nofile", Value: 4096}, {Name: "core", Value: 0}}, Seccomp: testFilter(f), UserNS: true,
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(full)
	env := []string{"ASAN_OPTIONS=detect_leaks=0:abort_on_error=0:exitcode=99", "UBSAN_OPTIONS=halt_on_error=1:exitcode=98"}
	f.Fuzz(func(t *testing.T, config []byte) {
		_, err := initproc.Decode(config)
		r := runHelperEnv(t, parser, config, true, env)
		switch {
		case r.code != 0 && r.code != initproc.ExitSetup:
			t.Fatalf("C parser crashed on %q: exit %d\n%s", config, r.code, r.stderr)
		case (r.code == 0) != (err == nil):
			t.Fatalf("on %q: Decode says %v, the C helper exits %d (%s)", config, err, r.code, r.report)
		}
	})
}

// buildParseOnlyHelper compiles the C helper with SIDECAR_INIT_PARSE_ONLY, sanitized when
// the compiler can.
func buildParseOnlyHelper(f *testing.F) string {
	cc := testtool.Need(f, "cc", "gcc", "it builds cmd/sidecar-init/sidecar-init.c")
	out := filepath.Join(f.TempDir(), "parse-only")
	base := []string{"-Wall", "-Wextra", "-Werror", "-DSIDECAR_INIT_PARSE_ONLY", "-o", out, cHelperSource}
	sanitized := append([]string{"-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all"}, base...)
	if _, err := exec.Command(cc, sanitized...).CombinedOutput(); err == nil {
		return out
	}
	if b, err := exec.Command(cc, append([]string{"-O2"}, base...)...).CombinedOutput(); err != nil {
		f.Fatalf("cc: %v\n%s", err, b)
	}
	f.Log("built without sanitizers: this compiler lacks them")
	return out
}

// Neither helper ever applies less Landlock than the daemon promised: below the minimum
// (a kernel with less, or a cap under it) the command does not start.
func TestHelpersRefuseBelowMinABI(t *testing.T) {
	kernel := landlock.ABI()
	cases := []struct {
		ll   initproc.Landlock
		want string
	}{{initproc.Landlock{MinABI: kernel + 1}, fmt.Sprintf("125 setup: landlock ABI %d, need %d", kernel, kernel+1)}}
	if kernel >= 2 {
		cases = append(cases, struct {
			ll   initproc.Landlock
			want string
		}{initproc.Landlock{MinABI: 2, MaxABI: 1}, "125 setup: landlock ABI 1, need 2"})
	}
	for _, h := range testHelpers {
		t.Run(h.name, func(t *testing.T) {
			helper := h.usable(t)
			for _, tc := range cases {
				ll := tc.ll
				ll.RX = []string{"/"}
				r := runHelper(t, helper, helperConfig(t, initproc.Config{Argv: []string{"/bin/echo", "ran"}, Landlock: &ll}), true)
				if r.code != initproc.ExitSetup || r.report != tc.want || r.stdout != "" {
					t.Errorf("Landlock %+v: %+v; want exit 125, %q", tc.ll, r, tc.want)
				}
			}
		})
	}
}

// testFilter is the system-call filter the daemon hands every helper.
func testFilter(t testing.TB) []unix.SockFilter {
	t.Helper()
	prog, err := seccomp.Program()
	if err != nil {
		t.Fatal(err)
	}
	return prog
}
