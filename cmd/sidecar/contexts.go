package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"text/tabwriter"

	"github.com/sidecar-sandbox/sidecar/client"
)

// Named daemons, as kubectl's contexts: a small JSON file maps a name to a URL, a token
// file and a CA file, and remembers the current one.

func init() {
	register("context", command{summary: "named daemons: add, use, ls, rm (the --context flag picks one per command)",
		usage: contextUsage, subs: []string{"ls", "use", "add", "rm"}, run: runContext})
}

const contextUsage = `usage: sidecar context ls
       sidecar context use NAME
       sidecar context add NAME --url URL [--token-file FILE] [--ca-file FILE]
                           [--client-cert-file FILE --client-key-file FILE] [--use]
       sidecar context rm NAME

A context names a daemon: its URL, the file holding its shared token, and the CA that
signed its certificate; the first one added becomes the current one. They live in $XDG_CONFIG_HOME/sidecar/contexts.json
(~/.config/sidecar/contexts.json; SIDECAR_CONTEXTS_FILE names another file). The file
holds paths, never a token.

Which daemon a command talks to, first match wins:
  1. --context NAME: that context as a whole (URL, token file, CA file);
  2. SANDBOX_REMOTE_URL with the other SANDBOX_REMOTE_* variables;
  3. the current context (context use).
--url URL then replaces the URL of whichever was chosen.`

// daemonContext is one named daemon.
type daemonContext struct {
	URL            string `json:"url"`
	TokenFile      string `json:"token_file,omitempty"`
	CAFile         string `json:"ca_file,omitempty"`
	ClientCertFile string `json:"client_cert_file,omitempty"`
	ClientKeyFile  string `json:"client_key_file,omitempty"`
}

// contextsFile is the file's content.
type contextsFile struct {
	Current  string                   `json:"current,omitempty"`
	Contexts map[string]daemonContext `json:"contexts"`
}

// contextsPath is where the contexts live.
func contextsPath() (string, error) {
	if p := os.Getenv("SIDECAR_CONTEXTS_FILE"); p != "" {
		return p, nil
	}
	dir, err := os.UserConfigDir()
	if err != nil {
		return "", fmt.Errorf("no place for the contexts file (%w); set SIDECAR_CONTEXTS_FILE", err)
	}
	return filepath.Join(dir, "sidecar", "contexts.json"), nil
}

// loadContexts reads the file; a missing file is no contexts.
func loadContexts() (contextsFile, string, error) {
	f := contextsFile{Contexts: map[string]daemonContext{}}
	path, err := contextsPath()
	if err != nil {
		return f, "", err
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return f, path, nil
	}
	if err != nil {
		return f, path, err
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return f, path, fmt.Errorf("%s: %w", path, err)
	}
	if f.Contexts == nil {
		f.Contexts = map[string]daemonContext{}
	}
	return f, path, nil
}

// save writes the file atomically, readable by its owner only.
func (f contextsFile) save(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// chosenContext is the context this command uses: --context, else the current one
// unless SANDBOX_REMOTE_URL names a daemon; ok false when none.
func chosenContext() (daemonContext, string, bool, error) {
	if globals.context == "" && os.Getenv(client.EnvURL) != "" {
		return daemonContext{}, "", false, nil
	}
	if _, err := contextsPath(); err != nil && globals.context == "" {
		return daemonContext{}, "", false, nil // no home: no current context either
	}
	f, path, err := loadContexts()
	if err != nil {
		return daemonContext{}, "", false, err
	}
	name := globals.context
	if name == "" {
		name = f.Current
	}
	if name == "" {
		return daemonContext{}, "", false, nil
	}
	dc, ok := f.Contexts[name]
	if !ok {
		return daemonContext{}, "", false, fmt.Errorf("no context %q in %s (sidecar context ls lists them)", name, path)
	}
	return dc, name, true, nil
}

// applyContext puts a chosen context into the environment HostConfigFromEnv reads, as a
// whole: its variables replace the SANDBOX_REMOTE_* ones, unset where it has no value.
func applyContext() error {
	dc, _, ok, err := chosenContext()
	if err != nil || !ok {
		return err
	}
	for k, v := range map[string]string{
		client.EnvURL: dc.URL, client.EnvTokenFile: dc.TokenFile, client.EnvCAFile: dc.CAFile,
		client.EnvClientCertFile: dc.ClientCertFile, client.EnvClientKeyFile: dc.ClientKeyFile,
	} {
		if v == "" {
			os.Unsetenv(k)
		} else {
			os.Setenv(k, v)
		}
	}
	if dc.TokenFile != "" {
		os.Unsetenv(client.EnvToken)
	}
	return nil
}

func runContext(_ context.Context, args []string) error {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, contextUsage)
		return usageError{}
	}
	switch args[0] {
	case "ls", "list":
		return contextList(args[1:])
	case "use":
		return contextUse(args[1:])
	case "add", "set":
		return contextAdd(args[1:])
	case "rm", "delete":
		return contextRemove(args[1:])
	}
	fmt.Fprintln(os.Stderr, contextUsage)
	return usagef("context: unknown subcommand %q", args[0])
}

func contextList(args []string) error {
	fs := newLocalFlagSet("context ls", "usage: sidecar context ls [-o table|json]")
	output := outputFlag(fs, "table", "json")
	if _, err := operands(fs, args, 0, "usage: sidecar context ls [-o table|json]"); err != nil {
		return err
	}
	f, _, err := loadContexts()
	if err != nil {
		return err
	}
	if output.json() {
		return printJSON(os.Stdout, f)
	}
	names := make([]string, 0, len(f.Contexts))
	for name := range f.Contexts {
		names = append(names, name)
	}
	sort.Strings(names)
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CURRENT\tNAME\tURL\tTOKEN FILE\tCA FILE")
	for _, name := range names {
		dc, mark := f.Contexts[name], ""
		if name == f.Current {
			mark = "*"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", mark, name, dc.URL, orDash(dc.TokenFile), orDash(dc.CAFile))
	}
	return tw.Flush()
}

func contextUse(args []string) error {
	const usage = "usage: sidecar context use NAME\n\nMakes NAME the current context: the daemon of commands given no --context and no SANDBOX_REMOTE_URL."
	pos, err := operands(newLocalFlagSet("context use", usage), args, 1, "usage: sidecar context use NAME")
	if err != nil {
		return err
	}
	f, path, err := loadContexts()
	if err != nil {
		return err
	}
	if _, ok := f.Contexts[pos[0]]; !ok {
		return fmt.Errorf("no context %q in %s (sidecar context ls lists them)", pos[0], path)
	}
	f.Current = pos[0]
	return f.save(path)
}

func contextAdd(args []string) error {
	const usage = "usage: sidecar context add NAME --url URL [--token-file FILE] [--ca-file FILE] [--client-cert-file FILE --client-key-file FILE] [--use]"
	fs := newLocalFlagSet("context add", usage+"\n\nAdds NAME, or replaces it. Relative file names are stored absolute.")
	var dc daemonContext
	fs.StringVar(&dc.URL, "url", "", "`URL` the daemon's https:// URL (required)")
	fs.StringVar(&dc.TokenFile, "token-file", "", "`FILE` holding the daemon's shared token (as SANDBOX_REMOTE_AUTH_TOKEN_FILE)")
	fs.StringVar(&dc.CAFile, "ca-file", "", "`FILE` the CA certificate that signed the daemon's (as SANDBOX_REMOTE_CA_FILE)")
	fs.StringVar(&dc.ClientCertFile, "client-cert-file", "", "`FILE` a client certificate for mTLS")
	fs.StringVar(&dc.ClientKeyFile, "client-key-file", "", "`FILE` its key")
	use := fs.Bool("use", false, "make it the current context too")
	pos, err := operands(fs, args, 1, usage)
	if err != nil {
		return err
	}
	if u, err := url.Parse(dc.URL); err != nil || u.Scheme != "https" || u.Host == "" {
		return usagef("context add: --url must be an https:// URL, not %q", dc.URL)
	}
	if (dc.ClientCertFile == "") != (dc.ClientKeyFile == "") {
		return usagef("context add: --client-cert-file and --client-key-file go together")
	}
	for _, p := range []*string{&dc.TokenFile, &dc.CAFile, &dc.ClientCertFile, &dc.ClientKeyFile} {
		if *p == "" {
			continue
		}
		abs, err := filepath.Abs(*p)
		if err != nil {
			return err
		}
		if _, err := os.Stat(abs); err != nil {
			return fmt.Errorf("context add: %w", err)
		}
		*p = abs
	}
	f, path, err := loadContexts()
	if err != nil {
		return err
	}
	f.Contexts[pos[0]] = dc
	if *use || f.Current == "" {
		f.Current = pos[0]
	}
	return f.save(path)
}

func contextRemove(args []string) error {
	pos, err := operands(newLocalFlagSet("context rm", "usage: sidecar context rm NAME"), args, 1, "usage: sidecar context rm NAME")
	if err != nil {
		return err
	}
	f, path, err := loadContexts()
	if err != nil {
		return err
	}
	if _, ok := f.Contexts[pos[0]]; !ok {
		return fmt.Errorf("no context %q in %s", pos[0], path)
	}
	delete(f.Contexts, pos[0])
	if f.Current == pos[0] {
		f.Current = ""
	}
	return f.save(path)
}
