package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/testtool"
)

// runCLI runs the CLI against d with stdin and returns stdout, stderr and the exit code.
func (d *netDaemon) runCLI(t *testing.T, stdin string, args ...string) (string, string, int) {
	t.Helper()
	cmd := d.cli(args...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("sidecar %v: %v", args, err)
	}
	return out.String(), errOut.String(), cmd.ProcessState.ExitCode()
}

// newLeaseCLI acquires a lease through the CLI and returns it.
func (d *netDaemon) newLeaseCLI(t *testing.T, args ...string) apitype.Lease {
	t.Helper()
	out, errOut, code := d.runCLI(t, "", append([]string{"leases", "new", "-o", "json"}, args...)...)
	var l apitype.Lease
	if code != 0 || json.Unmarshal([]byte(out), &l) != nil || l.ID == "" {
		t.Fatalf("leases new %q: exit %d: %s %s", args, code, out, errOut)
	}
	return l
}

// The CLI as a docker user drives it, against the real daemon: bundled and interspersed
// flags, streamed exec output, background processes.
func TestCLIDockerHabits(t *testing.T) {
	d := startNetDaemon(t)
	l := d.newLeaseCLI(t, "habits")

	// -it bundled, flags after the lease id, the command's own flags left alone.
	if out, errOut, code := d.runCLI(t, "piped\n", "exec", "-i", l.ID, "--", "cat"); code != 0 || out != "piped\n" {
		t.Fatalf("exec -i: exit %d, out %q, err %q", code, out, errOut)
	}
	if out, errOut, code := d.runCLI(t, "x\n", "exec", l.ID, "-i", "--cwd", ".", "sh", "-c", "read a; echo got $a; exit 5"); code != 5 || out != "got x\n" {
		t.Fatalf("exec L -i --cwd . sh -c: exit %d, out %q, err %q", code, out, errOut)
	}
	// -t: one terminal stream (stdout), a tty inside.
	if out, errOut, code := d.runCLI(t, "", "exec", "-it", l.ID, "--", "sh", "-c", "test -t 0 && echo tty"); code != 0 || !strings.Contains(out, "tty") {
		t.Fatalf("exec -it: exit %d, out %q, err %q", code, out, errOut)
	}
	if out, _, code := d.runCLI(t, "", "exec", l.ID, "ls", "-d", "/"); code != 0 || out != "/\n" {
		t.Fatalf("exec L ls -d /: exit %d, out %q (ls's -d must stay ls's)", code, out)
	}

	// Streamed by default: past the 1 MiB a captured exec keeps, every byte in order.
	if out, errOut, code := d.runCLI(t, "", "exec", l.ID, "seq", "1", "400000"); code != 0 || out != seqText(400000) {
		t.Fatalf("exec seq: exit %d, %d bytes of output (want %d), err %q", code, len(out), len(seqText(400000)), errOut)
	}

	// Ctrl-C ends a streamed exec quietly, with the shell's code for SIGINT.
	interrupted := d.cli("exec", l.ID, "sh", "-c", "echo up; sleep 60")
	upOut, upErr := &testtool.Buffer{}, &testtool.Buffer{}
	interrupted.Stdout, interrupted.Stderr = upOut, upErr
	if err := interrupted.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); upOut.String() != "up\n"; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			interrupted.Process.Kill()
			t.Fatalf("exec never started: %q %q", upOut.String(), upErr.String())
		}
	}
	interrupted.Process.Signal(syscall.SIGINT)
	_ = interrupted.Wait()
	if code := interrupted.ProcessState.ExitCode(); code != 130 || upErr.String() != "" {
		t.Fatalf("exec after SIGINT: exit %d, stderr %q; want 130 and nothing", code, upErr.String())
	}

	// info and version describe the daemon.
	if out, errOut, code := d.runCLI(t, "", "info"); code != 0 || !strings.Contains(out, "isolation:") ||
		!strings.Contains(out, "strict") || !strings.Contains(out, "layers:") || !strings.Contains(out, "free of") {
		t.Fatalf("info: exit %d, out %q, err %q", code, out, errOut)
	}
	if out, errOut, code := d.runCLI(t, "", "version"); code != 0 || !strings.Contains(out, "client: sidecar") || !strings.Contains(out, "server: sidecar") {
		t.Fatalf("version: exit %d, out %q, err %q", code, out, errOut)
	}

	// A daemon error carries one prefix.
	if _, errOut, code := d.runCLI(t, "", "exec", "no-such-lease", "true"); code != exitFailure || strings.Count(errOut, "sidecar:") != 1 {
		t.Fatalf("exec in an unknown lease: exit %d, stderr %q", code, errOut)
	}

	// exec -d, ps, logs, logs -f.
	out, errOut, code := d.runCLI(t, "", "exec", "-d", l.ID, "sh", "-c", "echo one; echo err >&2; until [ -e go ]; do sleep 0.05; done; echo two; exit 7")
	proc := strings.TrimSpace(out)
	if code != 0 || proc == "" {
		t.Fatalf("exec -d: exit %d, out %q, err %q", code, out, errOut)
	}
	if out, _, code := d.runCLI(t, "", "ps", l.ID); code != 0 || !strings.Contains(out, proc) || !strings.Contains(out, "running") {
		t.Fatalf("ps: exit %d:\n%s", code, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, errOut, code := d.runCLI(t, "", "logs", l.ID, proc)
		if code != 0 {
			t.Fatalf("logs: exit %d, err %q", code, errOut)
		}
		if out == "one\n" && errOut == "err\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("logs: out %q err %q, want one/err", out, errOut)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// logs -f follows to the end once the process may go on, and passes its exit code on.
	if _, _, code := d.runCLI(t, "", "exec", l.ID, "touch", "go"); code != 0 {
		t.Fatalf("touch go: exit %d", code)
	}
	out, _, code = d.runCLI(t, "", "logs", "-f", l.ID, proc)
	if code != 7 || out != "one\ntwo\n" {
		t.Fatalf("logs -f: exit %d, out %q; want 7 and the whole output", code, out)
	}

	// attach -i: live output, stdin to the process, its exit code at its end.
	out, errOut, code = d.runCLI(t, "", "exec", "-d", "-i", l.ID, "sh", "-c",
		"(while :; do echo tick; sleep 0.05; done) & read line; kill $!; echo got $line; exit 4")
	proc = strings.TrimSpace(out)
	if code != 0 || proc == "" {
		t.Fatalf("exec -d -i: exit %d, out %q, err %q", code, out, errOut)
	}
	pr, pw := io.Pipe()
	attach := d.cli("attach", "-i", l.ID, proc)
	attach.Stdin = pr
	attachOut, attachErr := &testtool.Buffer{}, &testtool.Buffer{}
	attach.Stdout, attach.Stderr = attachOut, attachErr
	if err := attach.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(attachOut.String(), "tick"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			attach.Process.Kill()
			t.Fatalf("attach shows no live output: %q %q", attachOut.String(), attachErr.String())
		}
	}
	io.WriteString(pw, "hello\n")
	pw.Close() // exec.Cmd's Wait waits for its stdin copy to end
	waited := make(chan error, 1)
	go func() { waited <- attach.Wait() }()
	var err error
	select {
	case err = <-waited:
	case <-time.After(60 * time.Second):
		attach.Process.Kill()
		t.Fatalf("attach did not end with its process: %q %q", attachOut.String(), attachErr.String())
	}
	if attach.ProcessState.ExitCode() != 4 || !strings.Contains(attachOut.String(), "got hello\n") || attachErr.String() != "" {
		t.Fatalf("attach -i: %v, out %q, err %q; want exit 4 and the line it read", err, attachOut.String(), attachErr.String())
	}
}

// renew, and a person's session keeping its lease alive and saying why it ended.
func TestCLIRenewAndAttachedSessions(t *testing.T) {
	d := startNetDaemon(t)
	l := d.newLeaseCLI(t, "renewing", "--ttl", "3s")

	out, errOut, code := d.runCLI(t, "", "renew", "--ttl", "1h", l.ID, "-o", "json")
	var renewed apitype.Lease
	if code != 0 || json.Unmarshal([]byte(out), &renewed) != nil || time.Until(renewed.ExpiresAt) < 50*time.Minute {
		t.Fatalf("renew --ttl 1h: exit %d, out %q, err %q", code, out, errOut)
	}
	if _, errOut, code := d.runCLI(t, "", "renew", "--ttl", "3s", l.ID); code != 0 {
		t.Fatalf("renew --ttl 3s: exit %d, err %q", code, errOut)
	}
	// exec -it renews the lease while it runs: the command outlives the 3 s TTL.
	if out, errOut, code := d.runCLI(t, "", "exec", "-it", l.ID, "sh", "-c", "sleep 7; echo alive"); code != 0 || !strings.Contains(out, "alive") {
		t.Fatalf("exec -it past the TTL: exit %d, out %q, err %q", code, out, errOut)
	}

	// A piped shell reads its commands and ends at the end of its input.
	if out, errOut, code := d.runCLI(t, "echo piped-$((1+1))\n", "shell", l.ID); code != 0 || out != "piped-2\n" {
		t.Fatalf("shell <script: exit %d, out %q, err %q", code, out, errOut)
	}
	if _, errOut, code := d.runCLI(t, "", "shell", l.ID); code != 0 {
		t.Fatalf("shell </dev/null: exit %d, err %q", code, errOut)
	}

	// Released under an attached session: the CLI says so.
	cmd := d.cli("exec", "-it", l.ID, "sh", "-c", "echo started; sleep 60")
	cmd.Stdin = strings.NewReader("")
	stdout, stderr := &testtool.Buffer{}, &testtool.Buffer{}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(stdout.String(), "started"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("exec -it never started: %q %q", stdout.String(), stderr.String())
		}
	}
	if _, errOut, code := d.runCLI(t, "", "leases", "rm", l.ID); code != 0 {
		t.Fatalf("leases rm: exit %d, %q", code, errOut)
	}
	err := cmd.Wait()
	if err == nil || !strings.Contains(stderr.String(), "lease "+l.ID+" was released") {
		t.Fatalf("exec -it in a released lease: %v, stderr %q", err, stderr.String())
	}
}

// leases ls filters and -q, leases new on an active session, rm of several ids.
func TestCLILeasesCommands(t *testing.T) {
	d := startNetDaemon(t)
	a := d.newLeaseCLI(t, "sess-a", "--label", "team=ml", "--ttl", "5m")
	b := d.newLeaseCLI(t, "sess-b", "--label", "team=web")

	ids := func(args ...string) string {
		t.Helper()
		out, errOut, code := d.runCLI(t, "", append([]string{"leases", "ls", "-q"}, args...)...)
		if code != 0 {
			t.Fatalf("leases ls -q %q: exit %d, %q", args, code, errOut)
		}
		return out
	}
	if got := ids(); !strings.Contains(got, a.ID+"\n") || !strings.Contains(got, b.ID+"\n") || strings.Count(got, "\n") != 2 {
		t.Fatalf("leases ls -q: %q", got)
	}
	if got := ids("--session", "sess-b"); got != b.ID+"\n" {
		t.Fatalf("leases ls -q --session sess-b: %q", got)
	}
	if got := ids("--label", "team=ml"); got != a.ID+"\n" {
		t.Fatalf("leases ls -q --label team=ml: %q", got)
	}
	if got := ids("--label", "team=none"); got != "" {
		t.Fatalf("leases ls -q --label team=none: %q", got)
	}

	// The session's active lease again: --ttl applied, and stderr says so.
	out, errOut, code := d.runCLI(t, "", "leases", "new", "sess-a", "--ttl", "1h", "-o", "json")
	var again apitype.Lease
	if code != 0 || json.Unmarshal([]byte(out), &again) != nil || again.ID != a.ID || time.Until(again.ExpiresAt) < 50*time.Minute ||
		!strings.Contains(errOut, "already has lease "+a.ID) || !strings.Contains(errOut, "--ttl applied") {
		t.Fatalf("leases new on an active session with --ttl 1h: exit %d, out %q, err %q", code, out, errOut)
	}
	if l, _ := d.client(t, "").Get(t.Context(), a.ID); time.Until(l.ExpiresAt) < 50*time.Minute {
		t.Fatalf("the daemon's lease expires %v: --ttl not applied", l.ExpiresAt)
	}

	// rm takes several ids; an unknown one fails the command, the others are released.
	out, errOut, code = d.runCLI(t, "", "leases", "rm", a.ID, "no-such-lease", b.ID)
	if code != exitFailure || out != a.ID+"\n"+b.ID+"\n" || !strings.Contains(errOut, "no-such-lease") {
		t.Fatalf("leases rm a unknown b: exit %d, out %q, err %q", code, out, errOut)
	}
	if got := ids(); got != "" {
		t.Fatalf("after rm: %q", got)
	}
}

// Named daemons: context add/use/ls/rm, --context and --url, and which wins over the
// SANDBOX_REMOTE_* variables (contexts.go).
func TestCLIContexts(t *testing.T) {
	d := startNetDaemon(t)
	file := filepath.Join(t.TempDir(), "contexts.json")
	run := func(env []string, args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.Command(d.bin, args...)
		cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + d.work, "SIDECAR_CONTEXTS_FILE=" + file}, env...)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		return out.String(), errOut.String(), cmd.ProcessState.ExitCode()
	}
	good, tokenFile, caFile := d.env["SANDBOX_REMOTE_URL"], d.env["SANDBOX_REMOTE_AUTH_TOKEN_FILE"], d.env["SANDBOX_REMOTE_CA_FILE"]
	const dead = "https://127.0.0.1:1" // nothing listens on port 1
	l := d.newLeaseCLI(t, "ctx")

	// No daemon named at all: the error says how to name one.
	if _, errOut, code := run(nil, "leases", "ls"); code != exitFailure || !strings.Contains(errOut, "SANDBOX_REMOTE_URL") {
		t.Fatalf("no daemon: exit %d, %q", code, errOut)
	}
	if _, errOut, code := run(nil, "context", "add", "dev", "--url", good, "--token-file", tokenFile, "--ca-file", caFile); code != 0 {
		t.Fatalf("context add dev: exit %d, %q", code, errOut)
	}
	if _, errOut, code := run(nil, "context", "add", "dead", "--url", dead, "--token-file", tokenFile, "--ca-file", caFile); code != 0 {
		t.Fatalf("context add dead: exit %d, %q", code, errOut)
	}
	// The first context added is the current one.
	if out, _, code := run(nil, "context", "ls"); code != 0 || !regexp.MustCompile(`(?m)^\*\s+dev\s`).MatchString(out) {
		t.Fatalf("context ls: exit %d:\n%s", code, out)
	}
	if out, errOut, code := run(nil, "leases", "ls", "-q"); code != 0 || out != l.ID+"\n" {
		t.Fatalf("leases ls in the current context: exit %d, out %q, err %q", code, out, errOut)
	}
	badEnv := []string{"SANDBOX_REMOTE_URL=" + dead, "SANDBOX_REMOTE_AUTH_TOKEN_FILE=" + tokenFile, "SANDBOX_REMOTE_CA_FILE=" + caFile}
	// SANDBOX_REMOTE_URL wins over the current context; --context wins over both.
	if _, errOut, code := run(badEnv, "leases", "ls", "-q"); code != exitFailure || !strings.Contains(errOut, "check SANDBOX_REMOTE_URL") {
		t.Fatalf("SANDBOX_REMOTE_URL of a dead daemon over the current context: exit %d, %q (want the hint)", code, errOut)
	}
	// Without the CA, the error names the variable that fixes it.
	noCA := []string{"SANDBOX_REMOTE_URL=" + good, "SANDBOX_REMOTE_AUTH_TOKEN_FILE=" + tokenFile}
	if _, errOut, code := run(noCA, "leases", "ls"); code != exitFailure || !strings.Contains(errOut, "set SANDBOX_REMOTE_CA_FILE") ||
		strings.Count(errOut, "sidecar:") != 1 {
		t.Fatalf("no CA: exit %d, %q; want one line naming SANDBOX_REMOTE_CA_FILE", code, errOut)
	}
	if out, errOut, code := run(badEnv, "--context", "dev", "leases", "ls", "-q"); code != 0 || out != l.ID+"\n" {
		t.Fatalf("--context dev over SANDBOX_REMOTE_URL: exit %d, out %q, err %q", code, out, errOut)
	}
	if out, errOut, code := run(badEnv, "leases", "ls", "--context=dev", "-q"); code != 0 || out != l.ID+"\n" {
		t.Fatalf("--context among the command's flags: exit %d, out %q, err %q", code, out, errOut)
	}
	// context use, and --url replacing the chosen context's URL.
	if _, errOut, code := run(nil, "context", "use", "dead"); code != 0 {
		t.Fatalf("context use dead: %d %q", code, errOut)
	}
	if _, _, code := run(nil, "leases", "ls", "-q"); code != exitFailure {
		t.Fatalf("leases ls in the dead context: exit %d", code)
	}
	if out, errOut, code := run(nil, "--url", good, "leases", "ls", "-q"); code != 0 || out != l.ID+"\n" {
		t.Fatalf("--url over the dead context: exit %d, out %q, err %q", code, out, errOut)
	}
	if _, errOut, code := run(nil, "--context", "nope", "leases", "ls"); code != exitFailure || !strings.Contains(errOut, "context ls") {
		t.Fatalf("--context nope: exit %d, %q", code, errOut)
	}
	if _, errOut, code := run(nil, "context", "rm", "dead"); code != 0 {
		t.Fatalf("context rm: %d %q", code, errOut)
	}
	if out, _, _ := run(nil, "context", "ls"); strings.Contains(out, "dead") {
		t.Fatalf("context ls after rm:\n%s", out)
	}
}

// Lease ids complete in bash and zsh, asked of the daemon (sidecar leases ls -q).
func TestCompletionOfLeaseIDs(t *testing.T) {
	d := startNetDaemon(t)
	l := d.newLeaseCLI(t, "complete-me")
	env := d.cli().Env
	for _, shell := range []string{"bash", "zsh"} {
		if _, err := exec.LookPath(shell); err != nil {
			testtool.Need(t, shell, shell, "lease id completion is tested in "+shell)
		}
		script, _, code := d.runCLI(t, "", "completion", shell)
		if code != 0 {
			t.Fatalf("completion %s: exit %d", shell, code)
		}
		for _, tt := range []struct {
			words []string
			want  string
		}{
			{[]string{"exec", ""}, l.ID},
			{[]string{"exec", "-it", "--cwd", "d", ""}, l.ID},
			{[]string{"leases", "rm", "x", ""}, l.ID},
			{[]string{"shells", "ls", ""}, l.ID},
			{[]string{"stat", ""}, l.ID + ":"},
			{[]string{"leases", "new", ""}, ""}, // a session id: nothing to offer
			{[]string{"exec", l.ID, ""}, ""},    // the command: files
		} {
			var call string
			words := append([]string{d.bin}, tt.words...)
			if shell == "bash" {
				call = fmt.Sprintf(`COMP_WORDS=(%s); COMP_CWORD=%d; _sidecar; printf '%%s\n' "${COMPREPLY[@]}"`, shellWords(words), len(words)-1)
			} else {
				call = fmt.Sprintf(`compadd() { if [[ $1 == -a ]]; then print -rl -- ${(P)2}; else while [[ $1 != -- ]]; do shift; done; shift; print -rl -- "$@"; fi }
_files() { :; }; _describe() { :; }; _values() { :; }
words=(%s); CURRENT=%d; _sidecar`, shellWords(words), len(words))
			}
			prelude := ""
			if shell == "zsh" {
				prelude = "compdef() { :; }\n"
			}
			cmd := exec.Command(shell, "-c", prelude+script+"\n"+call)
			cmd.Env = env
			cmd.Dir = t.TempDir() // no file names to mix in
			out, err := cmd.CombinedOutput()
			got := strings.Fields(string(out))
			has := slices.Contains(got, tt.want)
			if err != nil || (tt.want != "" && !has) || (tt.want == "" && slices.Contains(got, l.ID)) {
				t.Errorf("%s completion of %q: %v, offered %q, want %q", shell, tt.words, err, got, tt.want)
			}
		}
	}
}

// shellWords quotes words for a shell array.
func shellWords(words []string) string {
	q := make([]string, len(words))
	for i, w := range words {
		q[i] = "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}
