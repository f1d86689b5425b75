package main

import (
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/sidecar-sandbox/sidecar/internal/testtool"
)

// runBin runs the built CLI with an empty environment and returns stdout, stderr and the
// exit code.
func runBin(t *testing.T, bin string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return stdout.String(), stderr.String(), 0
	case errors.As(err, &ee):
		return stdout.String(), stderr.String(), ee.ExitCode()
	}
	t.Fatalf("%v: %v", args, err)
	return "", "", 0
}

// Every command and subcommand of the built binary answers --help (and -h) with its
// usage on stdout and exit 0; the command table is the list, so a new command is covered.
func TestHelpOnEveryCommand(t *testing.T) {
	bin := buildBinary(t, t.TempDir())
	invocations := [][]string{{"--help"}, {"help"}, {"-h"}}
	for _, name := range visibleCommands() {
		invocations = append(invocations, []string{name, "--help"}, []string{name, "-h"}, []string{"help", name})
		for _, sub := range commands[name].subs {
			invocations = append(invocations, []string{name, sub, "--help"})
		}
	}
	if len(invocations) < 30 {
		t.Fatalf("only %d invocations: is the command table empty?", len(invocations))
	}
	for _, args := range invocations {
		stdout, stderr, code := runBin(t, bin, args...)
		if code != 0 || !strings.Contains(strings.ToLower(stdout), "usage") {
			t.Errorf("sidecar %s: exit %d, stdout %q, stderr %q; want exit 0 and usage on stdout",
				strings.Join(args, " "), code, stdout, stderr)
		}
	}
}

// --help lists a command's flags, long ones with two dashes: every command without
// subcommands, and every subcommand, has flags (-o or the global --url at least); serve
// is configured by its environment alone, context use and rm take a name only.
var singleDashLong = regexp.MustCompile(`(?m)^  -[a-z][a-z-]+ `)

func TestHelpListsFlags(t *testing.T) {
	bin := buildBinary(t, t.TempDir())
	var invocations [][]string
	for _, name := range visibleCommands() {
		if subs := commands[name].subs; name == "serve" {
			continue
		} else if len(subs) == 0 {
			invocations = append(invocations, []string{name, "--help"})
		} else if name != "completion" {
			for _, sub := range subs {
				if name == "context" && (sub == "use" || sub == "rm") {
					continue
				}
				invocations = append(invocations, []string{name, sub, "--help"})
			}
		}
	}
	for _, args := range invocations {
		stdout, _, code := runBin(t, bin, args...)
		if code != 0 || !strings.Contains(stdout, "flags:\n  -") || singleDashLong.MatchString(stdout) {
			t.Errorf("sidecar %s: exit %d; want a flag list with --long flags:\n%s", strings.Join(args, " "), code, stdout)
		}
	}
	for _, name := range []string{"find", "grep", "stat", "watch", "edit"} {
		stdout, _, _ := runBin(t, bin, name, "--help")
		if !strings.Contains(stdout, "\n  -o FORMAT") && name != "edit" || name == "edit" && !strings.Contains(stdout, "--old TEXT") {
			t.Errorf("sidecar %s --help lists no flags of its own:\n%s", name, stdout)
		}
	}
}

// Bad command lines exit 2 (docs/operations.md), -o included, before any request.
func TestUsageErrorsExit2(t *testing.T) {
	bin := buildBinary(t, t.TempDir())
	for _, args := range [][]string{
		{},
		{"no-such-command"},
		{"leases"},
		{"leases", "frobnicate"},
		{"shells"},
		{"shells", "frobnicate"},
		{"shells", "run", "L1", "S1"},
		{"shells", "rm", "L1"},
		{"shells", "ls", "-o", "yaml", "L1"},
		{"leases", "ls", "-o", "yaml"},
		{"leases", "show", "-o", "table", "L1"},
		{"leases", "new", "s", "-o", "xml"},
		{"leases", "new", "s", "--network", "host"},
		{"leases", "network", "L1"},
		{"leases", "network", "L1", "--network", "none", "--allow-out", "a.com"},
		{"port-forward", "L1"},
		{"port-forward", "L1", "70000"},
		{"port-forward", "L1", "x:80"},
		{"cleanup", "-o", "yaml"},
		{"token", "-o", "yaml"},
		{"version", "-o", "yaml"},
		{"script", "run", "-o", "text", "t.js"},
		{"exec", "L1"},
		{"exec", "--bogus", "L1", "true"},
		{"cp", "a", "b"},
		{"completion", "fish"},
		{"find"},
		{"find", "--type", "x", "L1:."},
		{"grep", "pattern"},
		{"grep", "pattern", "not-remote"},
		{"stat", "L1:a", "L1:b"},
		{"edit", "--new", "x", "L1:a"},
		{"watch"},
		{"exec", "-ix", "L1", "true"},
		{"leases", "rm"},
		{"leases", "ls", "extra"},
		{"renew"},
		{"renew", "--ttl", "1.5s", "L1"},
		{"logs", "L1"},
		{"attach", "L1"},
		{"ps"},
		{"info", "extra"},
		{"context"},
		{"context", "use"},
		{"context", "add", "x", "--url", "http://plain"},
		{"--url"},
	} {
		if _, stderr, code := runBin(t, bin, args...); code != exitUsage {
			t.Errorf("sidecar %s: exit %d, want %d; stderr %q", strings.Join(args, " "), code, exitUsage, stderr)
		}
	}
	for _, args := range [][]string{{"token", "-o", "json"}, {"version", "-o", "json"}} {
		if stdout, _, code := runBin(t, bin, args...); code != 0 || !strings.HasPrefix(stdout, "{") {
			t.Errorf("sidecar %s: exit %d, stdout %q", strings.Join(args, " "), code, stdout)
		}
	}
	// Operator commands need a URL and a token, not SANDBOX_PROVIDER: without a URL the
	// error names the URL only.
	if _, stderr, code := runBin(t, bin, "leases", "ls"); code != exitFailure ||
		!strings.Contains(stderr, "SANDBOX_REMOTE_URL") || strings.Contains(stderr, "SANDBOX_PROVIDER") {
		t.Errorf("leases ls without configuration: exit %d, stderr %q", code, stderr)
	}
}

// The completion scripts list every visible command and parse in their shells.
func TestCompletionScripts(t *testing.T) {
	bin := buildBinary(t, t.TempDir())
	missing := ""
	for _, shell := range []string{"bash", "zsh"} {
		script, _, code := runBin(t, bin, "completion", shell)
		if code != 0 {
			t.Fatalf("completion %s: exit %d", shell, code)
		}
		for _, name := range visibleCommands() {
			if !strings.Contains(script, name) {
				t.Errorf("%s completion lacks %q", shell, name)
			}
		}
		if _, ok := testtool.Find(shell); !ok {
			missing = shell // checked last, so the other shell's checks still run
			continue
		}
		if out, err := exec.Command(shell, "-n", "-c", script).CombinedOutput(); err != nil {
			t.Errorf("%s -n: %v\n%s", shell, err, out)
		}
	}
	// bash really completes: the subcommands of leases after "sidecar leases ".
	script, _, _ := runBin(t, bin, "completion", "bash")
	out, err := exec.Command("bash", "-c", script+`
COMP_WORDS=(sidecar leases ""); COMP_CWORD=2; _sidecar; echo "${COMPREPLY[*]}"`).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ls show rm new network leftovers kill snapshot" {
		t.Errorf("bash completion of 'sidecar leases ': %v %q", err, out)
	}
	// ...and the values of --network after it.
	out, err = exec.Command("bash", "-c", script+`
COMP_WORDS=(sidecar leases new s --network ""); COMP_CWORD=5; _sidecar; echo "${COMPREPLY[*]}"`).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "none allowlist internet" {
		t.Errorf("bash completion of 'sidecar leases new s --network ': %v %q", err, out)
	}
	if missing != "" {
		testtool.Need(t, missing, missing, "it parses the "+missing+" completion script")
	}
}
