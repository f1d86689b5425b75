package initproc

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func fullConfig() *Config {
	return &Config{
		Argv: []string{"/bin/sh", "-c", "echo hi", ""}, Env: []string{"PATH=/bin", "A=b=c"},
		Dir: "/w", UID: 1000, GID: 2147483647,
		CgroupProcs: []string{"/sys/fs/cgroup/memory/x/cgroup.procs", "/sys/fs/cgroup/pids/x/cgroup.procs"},
		TmpDir:      "/t", HostMountNS: "mnt:[4026531841]", NetNS: true, Root: "/l/root/merged", Home: "/l/home",
		Detach: []string{"/var/lib/sidecar", "/srv/work"}, MountNS: true, Trees: []string{"/var/lib/sidecar/pts/l1", "/srv/work/l1/tmp"},
		Landlock: &Landlock{MinABI: 6, MaxABI: 7, RW: []string{"/w", "/tmp"}, RX: []string{"/usr"}, RO: []string{"/etc"}, Dev: []string{"/dev/null"}},
		Rlimits:  []Rlimit{{"nofile", 4096}, {"core", 0}, {"memlock", 65536}, {"msgqueue", 819200}, {"sigpending", 4096}},
		Seccomp:  []unix.SockFilter{{Code: 0x20, K: 4}, {Code: 0x15, Jt: 1, Jf: 0, K: 0xc000003e}, {Code: 0x6, K: 0x7fff0000}},
		UserNS:   true,
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	for _, cfg := range []*Config{
		fullConfig(),
		{Argv: []string{"true"}},
		{Argv: []string{"true"}, Landlock: &Landlock{}},
	} {
		b, err := Encode(cfg)
		if err != nil {
			t.Fatalf("Encode(%+v): %v", cfg, err)
		}
		got, err := Decode(b)
		if err != nil {
			t.Fatalf("Decode(%q): %v", b, err)
		}
		if !reflect.DeepEqual(got, cfg) {
			t.Errorf("round trip:\n got %+v\nwant %+v", got, cfg)
		}
	}
}

func TestEncodeRefuses(t *testing.T) {
	for name, mod := range map[string]func(*Config){
		"empty argv":           func(c *Config) { c.Argv = nil },
		"empty argv0":          func(c *Config) { c.Argv[0] = "" },
		"NUL in arg":           func(c *Config) { c.Argv[1] = "a\x00b" },
		"NUL in env":           func(c *Config) { c.Env[0] = "A=\x00" },
		"NUL in path":          func(c *Config) { c.Landlock.RO = []string{"/etc\x00/x"} },
		"negative uid":         func(c *Config) { c.UID = -1 },
		"huge gid":             func(c *Config) { c.GID = 1 << 31 },
		"userns as 0":          func(c *Config) { c.UID = 0 },
		"too large":            func(c *Config) { c.Env = append(c.Env, strings.Repeat("x", MaxConfigSize)) },
		"bad rlimit":           func(c *Config) { c.Rlimits = []Rlimit{{"fsize", 1}} },
		"huge rlimit":          func(c *Config) { c.Rlimits = []Rlimit{{"nofile", 1 << 31}} },
		"long filter":          func(c *Config) { c.Seccomp = make([]unix.SockFilter, unix.BPF_MAXINSNS+1) },
		"tree without mountns": func(c *Config) { c.MountNS = false },
		"tree a detach root":   func(c *Config) { c.Trees = []string{"/srv/work"} },
		"tree outside":         func(c *Config) { c.Trees = []string{"/etc/resolv.conf"} },
		"tree not clean":       func(c *Config) { c.Trees = []string{"/srv/work/l1/"} },
		"tree under a tree":    func(c *Config) { c.Trees = []string{"/srv/work/l1", "/srv/work/l1/tmp"} },
	} {
		cfg := fullConfig()
		mod(cfg)
		if b, err := Encode(cfg); !errors.Is(err, errConfig) {
			t.Errorf("%s: Encode = %q, %v; want errConfig", name, b, err)
		}
	}
}

// The helpers' refusals (Decode's and the C helper's alike) are tested in package sandbox,
// which runs both helper binaries on the same bad configs.

// FuzzDecode: Decode never panics, and what it accepts encodes back to the same bytes
// (one representation per config, so the helpers cannot disagree on a reordering).
func FuzzDecode(f *testing.F) {
	b, _ := Encode(fullConfig())
	f.Add(b)
	f.Add([]byte("sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00"))
	f.Add([]byte("sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00landlock\x006\x00ll_rw\x00/\x00"))
	f.Add([]byte("sidecar-init/1\x00argv\x00true\x00uid\x000\x00gid\x000\x00landlock\x002\x00landlock_max_abi\x000\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		cfg, err := Decode(b)
		if err != nil {
			return
		}
		again, err := Encode(cfg)
		if err != nil {
			t.Fatalf("Encode(Decode(%q)): %v", b, err)
		}
		cfg2, err := Decode(again)
		if err != nil || !reflect.DeepEqual(cfg, cfg2) {
			t.Fatalf("Decode(Encode(Decode(%q))) = %+v, %v; want %+v", b, cfg2, err, cfg)
		}
	})
}

// BindSources lists each source under a detach root once, a source under another in that
// one's recursive copy, and the image root recursive.
func TestBindSources(t *testing.T) {
	cfg := &Config{
		Detach: []string{"/state", "/work"},
		TmpDir: "/work/l1/tmp", WorkDir: "/work/l1/work", Home: "/work/l1/work/home", PTSDir: "/state/pts/l1",
		Passwd: "/state/users/l1/passwd", Group: "/state/users/l1/group", Resolv: "/etc/resolv.conf",
		Root: "/work/l1/root/merged",
	}
	want := []BindSource{{"/state/pts/l1", false}, {"/state/users/l1/group", false}, {"/state/users/l1/passwd", false},
		{"/work/l1/root/merged", true}, {"/work/l1/tmp", false}, {"/work/l1/work", true}}
	got := cfg.BindSources()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("BindSources() = %v, want %v", got, want)
	}
	cfg.Argv, cfg.MountNS = []string{"true"}, true
	for _, s := range got {
		cfg.Trees = append(cfg.Trees, s.Path)
	}
	if _, err := Encode(cfg); err != nil {
		t.Errorf("Encode refused BindSources as trees: %v", err)
	}
}
