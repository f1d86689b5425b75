package daemon_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// A lease's workdir is /workspace to its processes and to the API alike: pwd prints it, a
// path printed inside the lease reads the file through the files API, and the host's work
// root reaches neither a reply nor the lease's environment.
func TestWorkspaceE2E(t *testing.T) {
	needRoot(t)
	d := startDaemon(t)
	l := d.acquire("workspace")
	ctx := context.Background()
	if w := l.Info().Workdir; w != "/workspace" {
		t.Errorf("acquire reply workdir %q, want /workspace", w)
	}
	if info := must(l.Get(ctx))(t); info.Workdir != "/workspace" {
		t.Errorf("lease info workdir %q, want /workspace", info.Workdir)
	}

	res := must(l.Exec(ctx, apitype.ExecRequest{Argv: []string{"pwd"}}))(t)
	if res.Stdout != "/workspace\n" {
		t.Fatalf("pwd = %q, want /workspace (stderr %q)", res.Stdout, res.Stderr)
	}
	// A decoy at workspace/a.txt: an absolute path "cleaned" into a relative one would
	// read it instead.
	must(l.Exec(ctx, sh(`echo hi > a.txt && mkdir -p sub workspace && echo decoy > workspace/a.txt`)))(t)
	if b := must(l.ReadFile(ctx, "/workspace/a.txt"))(t); string(b) != "hi\n" {
		t.Errorf("client ReadFile(/workspace/a.txt) = %q, want hi", b)
	}
	files := apitype.RouteLeases + "/" + l.ID() + "/files/"
	for _, p := range []string{"/workspace/a.txt", "%2Fworkspace%2Fa.txt", "%2Fworkspace/a.txt", "a.txt"} {
		status, _, body := d.raw(http.MethodGet, files+p, testToken, nil, nil)
		if status != http.StatusOK || string(body) != "hi\n" {
			t.Errorf("GET files/%s = %d %q, want 200 hi", p, status, body)
		}
	}
	status, _, body := d.raw(http.MethodGet, files+"/workspace", testToken, nil, nil)
	if status != http.StatusOK || !strings.Contains(string(body), `"a.txt"`) {
		t.Errorf("GET files//workspace = %d %s, want the workdir's listing", status, body)
	}
	for _, p := range []string{"/etc/passwd", "%2Fworkspace%2F..%2Fetc%2Fpasswd", "/workspaces/a.txt", "%2Fetc%2Fpasswd", "/workspace/../etc/passwd"} {
		status, hdr, body := d.raw(http.MethodGet, files+p, testToken, nil, nil)
		if status == http.StatusOK || strings.Contains(string(body), "root:") {
			t.Errorf("GET files/%s = %d %q", p, status, body)
			continue
		}
		// A literal "/../" is the router's first: it redirects to the cleaned path
		// (files/etc/passwd, relative), which the raw client follows, to a 404.
		if !strings.Contains(p, "/../") {
			wantProblem(t, status, hdr, body, http.StatusBadRequest, apitype.CodePathOutsideWorkdir)
		}
	}
	if _, err := l.ReadFile(ctx, "/etc/passwd"); !errors.Is(err, client.ErrPathOutsideWorkdir) {
		t.Errorf("client ReadFile(/etc/passwd) = %v, want ErrPathOutsideWorkdir", err)
	}

	// Writes, the tools and exec's cwd take the same absolute form.
	if err := l.WriteFile(ctx, "/workspace/sub/b.txt", []byte("bee\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if st := must(l.FileStat(ctx, "/workspace/sub/b.txt"))(t); !st.Exists || st.Size != 4 {
		t.Errorf("FileStat(/workspace/sub/b.txt) = %+v", st)
	}
	found := must(l.Find(ctx, "/workspace/sub", client.FindOptions{}))(t)
	if len(found.Entries) != 1 || found.Entries[0].Path != "b.txt" {
		t.Errorf("Find(/workspace/sub) = %+v, want b.txt (relative to the start, as always)", found.Entries)
	}
	res = must(l.Exec(ctx, apitype.ExecRequest{Argv: []string{"/bin/sh", "-c", "pwd; cat b.txt"}, Cwd: "/workspace/sub"}))(t)
	if res.Stdout != "/workspace/sub\nbee\n" {
		t.Errorf("cwd /workspace/sub: %q %q", res.Stdout, res.Stderr)
	}
	for _, cwd := range []string{"/etc", "/workspace/../etc", "/workspaces"} {
		if _, err := l.Exec(ctx, apitype.ExecRequest{Argv: []string{"pwd"}, Cwd: cwd}); !errors.Is(err, client.ErrPathOutsideWorkdir) {
			t.Errorf("cwd %q: %v, want ErrPathOutsideWorkdir", cwd, err)
		}
	}

	// The host's layout is in no reply and nowhere in the lease's environment.
	hostPaths := []string{d.cfg.WorkRoot, d.cfg.StateDir}
	replies := map[string]string{}
	for _, p := range []string{"/v1/leases", "/v1/leases/" + l.ID(), files, files + "/workspace/sub", "/v1/leases/" + l.ID() + "/find/", "/v1/leases/" + l.ID() + "/stat//workspace/sub/b.txt"} {
		_, _, body := d.raw(http.MethodGet, p, testToken, nil, nil)
		replies[p] = string(body)
	}
	res = must(l.Exec(ctx, sh(`env; tr '\0' '\n' < /proc/self/environ; echo; readlink /proc/self/cwd; pwd -P; echo ~; cat /etc/passwd /etc/group; ls /`)))(t)
	replies["the lease's environment"] = res.Stdout + res.Stderr
	for what, text := range replies {
		for _, host := range hostPaths {
			if strings.Contains(text, host) {
				t.Errorf("%s holds the host path %s:\n%s", what, host, text)
			}
		}
	}
}

// The lease's uid is a user with a name, a group and a home, for every tool that asks:
// whoami, id, getpass (which reads $USER first, and pwd), and git committing with the
// identity the user configured, kept in the home, not in the workspace the agent commits.
func TestNamedUserE2E(t *testing.T) {
	needRoot(t)
	needPython(t)
	d := startDaemon(t)
	l := d.acquire("named-user")
	ctx := context.Background()
	res := must(l.Exec(ctx, sh(`whoami; id -un; id -gn
python3 -c 'import getpass, os, pwd; print(getpass.getuser()); p = pwd.getpwuid(os.getuid()); print(p.pw_name, p.pw_dir)'
echo $USER $LOGNAME $HOME $SHELL $LANG "${TERM-no term}"`)))(t)
	shell := "/bin/sh"
	if must(l.Exec(ctx, sh(`test -x /bin/bash`)))(t).ExitCode == 0 {
		shell = "/bin/bash"
	}
	home := "/workspace" // a host without /home has no mount point for the lease's home tree
	if st, err := os.Stat("/home"); err == nil && st.IsDir() {
		home = "/home/user"
	}
	want := "user\nuser\nuser\nuser\nuser " + home + "\nuser user " + home + " " + shell + " C.UTF-8 no term\n"
	if res.ExitCode != 0 || res.Stdout != want {
		t.Errorf("got %q (exit %d, stderr %q), want %q", res.Stdout, res.ExitCode, res.Stderr, want)
	}
	res = must(l.Exec(ctx, sh(`set -e
git config --global user.name 'Ada Lovelace'
git config --global user.email ada@example.com
git init -q repo && cd repo && echo x > f && git add f && git commit -qm first
git log -1 --format='%an <%ae>'
test -f ~/.gitconfig && echo global config in the home
test -f /workspace/.gitconfig && echo global config in the workspace || true`)))(t)
	wantGit := "Ada Lovelace <ada@example.com>\nglobal config in the home\n"
	if home == "/workspace" {
		wantGit += "global config in the workspace\n"
	}
	if res.ExitCode != 0 || res.Stdout != wantGit {
		t.Errorf("git commit: exit %d %q %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	// A terminal gets TERM.
	p := must(l.ExecStream(ctx, client.ExecStreamRequest{Argv: []string{"/bin/sh", "-c", "echo TERM=$TERM; whoami"}, TTY: true}))(t)
	out, err := io.ReadAll(p.Stdout)
	if err != nil {
		t.Fatal(err)
	}
	st := must(p.Wait(ctx))(t)
	if !strings.Contains(string(out), "TERM=xterm-256color") || !strings.Contains(string(out), "user") || st.ExitCode != 0 {
		t.Errorf("TTY: %q %+v", out, st)
	}
}
