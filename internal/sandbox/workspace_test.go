package sandbox

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// A lease process sees its workdir at /workspace and its uid as a named user, through its
// own /etc/passwd and /etc/group, with root and nobody kept; the host's paths reach it
// nowhere but in /proc/self/mountinfo.
func TestWorkspaceAndUser(t *testing.T) { forEachHelper(t, testWorkspaceAndUser) }

func testWorkspaceAndUser(t *testing.T, s *Sandbox) {
	l := newTestLease(t, s, nil)
	if err := os.Mkdir(filepath.Join(l.Workdir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	id := strconv.Itoa(l.UID)
	// Busybox's tools too (the VM tests have no others): no getent, no NSS.
	r := run(t, s, l.ID, sh(`echo pwd $(pwd) $(pwd -P)
echo home $HOME
echo whoami $(whoami)
echo id $(id -un) $(id -gn) $(id -u)
echo getent $(grep '^user:' /etc/passwd) $(grep '^user:' /etc/group)
echo root $(awk -F: '$3 == 0 {print $1}' /etc/passwd) $(awk -F: '$3 == 0 {print $1}' /etc/group)
echo nobody $(awk -F: '$3 == 65534 {print $1 ":" $3}' /etc/passwd)
echo lines $(wc -l < /etc/passwd) $(wc -l < /etc/group)
echo owner $(stat -c %U:%G /workspace)
cd sub && echo sub $(pwd) && cd ..
echo hi > a.txt && echo wrote
(echo x >> /etc/passwd) 2>/dev/null && echo passwd-writable
(echo x >> /etc/group) 2>/dev/null && echo group-writable
echo mount $(grep -E '^[^ ]+ [^ ]+ [^ ]+ [^ ]+ /workspace ' /proc/self/mountinfo | tail -n 1 | cut -d' ' -f6)
echo env; env; echo; tr '\0' '\n' < /proc/self/environ`))
	got := map[string]string{}
	out := lines(r.stdout)
	for i, line := range out {
		if line == "env" {
			env := strings.Join(out[i+1:], "\n")
			for _, host := range []string{l.Workdir, filepath.Dir(l.Workdir), l.TmpDir} {
				if strings.Contains(env, host) {
					t.Errorf("the lease's environment holds the host path %s:\n%s", host, env)
				}
			}
			break
		}
		k, v, _ := strings.Cut(line, " ")
		got[k] = v
	}
	want := map[string]string{
		"pwd": "/workspace /workspace", "home": "/workspace", "whoami": "user", "id": "user user " + id,
		"getent": "user:x:" + id + ":" + id + ":user:/workspace:" + s.shell + " user:x:" + id + ":",
		"root":   "root root", "nobody": "nobody:65534", "lines": "3 3", "owner": "user:user",
		"sub": "/workspace/sub",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %q, want %q", k, got[k], v)
		}
	}
	for _, k := range []string{"passwd-writable", "group-writable"} {
		if _, ok := got[k]; ok {
			t.Errorf("%s: the lease may write its user database", k)
		}
	}
	if _, ok := got["wrote"]; !ok {
		t.Error("echo hi > a.txt failed in /workspace")
	}
	// The last mount on /workspace is the one in force: the lease's bind.
	if opts := got["mount"]; !strings.Contains(opts, "nosuid") || !strings.Contains(opts, "nodev") {
		t.Errorf("/workspace mount options %q, want nosuid,nodev", opts)
	}
	if opts := got["mount"]; !strings.Contains(opts, "nodev") {
		t.Errorf("/workspace mount options %q, want nodev", opts)
	}
	if b, err := os.ReadFile(filepath.Join(l.Workdir, "a.txt")); err != nil || string(b) != "hi\n" {
		t.Errorf("a.txt on the host: %q, %v", b, err)
	}
	if t.Failed() {
		t.Logf("output:\n%s%s", r.stdout, r.stderr)
	}

	// argv[0] and cwd may name the workdir as the lease does.
	if err := os.WriteFile(filepath.Join(l.Workdir, "sub", "prog"), []byte("#!/bin/sh\necho ran in $(pwd)\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, spec := range []Spec{
		{Argv: []string{"/workspace/sub/prog"}},
		{Argv: []string{"./prog"}, Dir: "/workspace/sub"},
		{Argv: []string{"prog"}, Dir: "sub", Env: map[string]string{"PATH": "/workspace/sub"}},
	} {
		if r := run(t, s, l.ID, spec); r.exitCode != 0 || !strings.Contains(r.stdout, "ran in /workspace") {
			t.Errorf("%q in %q: exit %d %q %q", spec.Argv, spec.Dir, r.exitCode, r.stdout, r.stderr)
		}
	}
}

// The lease's user database: root and nobody as the host has them, without passwords or
// group members, then the lease's user.
func TestUserDBFiles(t *testing.T) {
	host := "root:$6$secret:0:0:Super User:/root:/bin/bash\nuser:x:0:0::/:/bin/sh\nnobody:x:65534:65534:Kernel Overflow User:/:/sbin/nologin\n"
	groups := "root:x:0:admin,alice\nnobody:x:65534:bob\n"
	db := userDB{
		root:    hostEntry(host, "0", 7, defaultRoot),
		nobody:  hostEntry(host, nobodyID, 7, defaultNobody),
		rootG:   hostEntry(groups, "0", 4, defaultRootG),
		nobodyG: hostEntry("", nobodyID, 4, defaultNobodG),
		shell:   "/bin/bash",
	}
	passwd, group := db.files(200001, 200002, Workspace)
	wantP := "root:x:0:0:Super User:/root:/bin/bash\nnobody:x:65534:65534:Kernel Overflow User:/:/sbin/nologin\nuser:x:200001:200002:user:/workspace:/bin/bash\n"
	wantG := "root:x:0:\nnogroup:x:65534:\nuser:x:200002:\n"
	if passwd != wantP || group != wantG {
		t.Errorf("passwd %q, group %q;\nwant %q, %q", passwd, group, wantP, wantG)
	}
}

// An exec cwd names the workdir relatively or under /workspace, nothing else.
func TestWorkspaceRel(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{"a/b", "a/b", true}, {"/workspace", ".", true}, {"/workspace/", ".", true},
		{"/workspace/a", "a", true}, {"/workspace//a/.", "a/.", true}, {"/workspaces", "", false}, {"/etc", "", false}, {"/", "", false},
	} {
		got, ok := workspaceRel(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("workspaceRel(%q) = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestLeaseHome(t *testing.T) { forEachHelper(t, testLeaseHome) }

// A lease with a home tree has HOME (and the XDG directories) of its own, outside the
// workdir, on the lease's directory, writable by it alone; /home shows only it.
func testLeaseHome(t *testing.T, s *Sandbox) {
	if !s.hostHome {
		t.Skip("this host has no /home to bind a lease's home tree on")
	}
	l := newTestLease(t, s, func(l *LeaseSpec) {
		l.HomeDir = filepath.Join(filepath.Dir(l.Workdir), "home")
		if err := os.Mkdir(l.HomeDir, 0o700); err != nil {
			t.Fatal(err)
		}
	})
	r := run(t, s, l.ID, sh(`echo home $HOME; echo cache $XDG_CACHE_HOME; cd && echo cd $(pwd)
mkdir -p .cache/tool && echo cached > .cache/tool/x && echo wrote
echo ls $(ls -A /home)
echo passwd $(grep '^user:' /etc/passwd | cut -d: -f6)
echo owner $(stat -c %U:%a /home/user) $(stat -c %U:%a /home)
(touch /home/other) 2>/dev/null && echo home-writable
echo pwd $(cd /workspace && pwd) $(ls -A /workspace | wc -l)`))
	want := map[string]string{
		"home": LeaseHome, "cache": LeaseHome + "/.cache", "cd": LeaseHome, "wrote": "",
		"ls": LeaseUser, "passwd": LeaseHome, "owner": "user:700 root:755", "pwd": "/workspace 0",
	}
	got := map[string]string{}
	for _, line := range lines(r.stdout) {
		k, v, _ := strings.Cut(line, " ")
		got[k] = v
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s: %q, want %q (stdout %q, stderr %q)", k, g, v, r.stdout, r.stderr)
		}
	}
	if _, ok := got["home-writable"]; ok {
		t.Error("the lease wrote into /home itself")
	}
	if b, err := os.ReadFile(filepath.Join(l.HomeDir, LeaseUser, ".cache/tool/x")); err != nil || string(b) != "cached\n" {
		t.Errorf("the cache file on the host: %q, %v; want it in the lease's home tree", b, err)
	}
}

// Lease processes start with umask 022 whatever the daemon's (UMask=0077 in its unit): a
// command started the plain way, one a launcher made ahead runs, and one after quiet.
func TestLeaseUmask(t *testing.T) { forEachHelper(t, testLeaseUmask) }

func testLeaseUmask(t *testing.T, s *Sandbox) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	l := newTestLease(t, s, nil)
	for i := range 3 {
		if i == 2 && !cold(t) {
			readyLauncher(t, s, l.ID)
		}
		r := run(t, s, l.ID, sh(`umask; touch f$$; stat -c %a f$$; rm f$$`))
		if got := strings.Join(lines(r.stdout), " "); r.exitCode != 0 || got != "0022 644" {
			t.Errorf("command %d: %q (exit %d, %q); want umask 0022 and a file made 644", i, got, r.exitCode, r.stderr)
		}
	}
}
