package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"golang.org/x/term"

	"github.com/sidecar-sandbox/sidecar/client"
)

// newClient builds a client from the SANDBOX_REMOTE_* variables. A lease token, when
// given, replaces the shared token (it opens that lease only). SANDBOX_PROVIDER is not
// required: it says whether an app uses sandboxes, while whoever runs this CLI has
// chosen the daemon already (an operator on the host needs only a URL and a token).
func newClient(leaseToken string) (*client.Client, error) {
	if leaseToken != "" {
		// The CLI process is ours alone: overriding its environment is the simplest way
		// to let HostConfigFromEnv validate everything else unchanged.
		os.Setenv(client.EnvToken, leaseToken)
		os.Unsetenv(client.EnvTokenFile)
	}
	if err := applyDaemonChoice(); err != nil {
		return nil, err
	}
	cfg, err := client.HostConfigFromEnv()
	if err != nil {
		return nil, err
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	return client.New(cfg)
}

// applyDaemonChoice puts the chosen context and --url into the environment
// HostConfigFromEnv reads (contexts.go: which wins).
func applyDaemonChoice() error {
	if err := applyContext(); err != nil {
		return err
	}
	if globals.url != "" {
		os.Setenv(client.EnvURL, globals.url)
	}
	return nil
}

// daemonNamed reports whether anything names a daemon for this command (version asks
// one only then).
func daemonNamed() bool {
	if globals.url != "" || globals.context != "" || os.Getenv(client.EnvURL) != "" {
		return true
	}
	_, _, ok, _ := chosenContext()
	return ok
}

// parseInterspersed parses flags that may come before, between or after positional
// arguments ("leases new SESSION --ttl 1h"); "--" ends flag parsing. A bad flag is a
// usage error; -h is flag.ErrHelp.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		args = expandBundles(fs, args) // so that fs.Args() is a tail of args
		if err := parseFlags(fs, args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		// fs.Parse consumed a "--" if the argument before rest is one.
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// multiFlag collects a repeatable flag such as --env K=V.
// operands is parseInterspersed wanting exactly n operands: any other count is the usage
// error usage.
func operands(fs *flag.FlagSet, args []string, n int, usage string) ([]string, error) {
	pos, err := parseInterspersed(fs, args)
	if err == nil && len(pos) != n {
		err = usageError{usage}
	}
	return pos, err
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// keyValues turns K=V strings into a map.
func keyValues(kvs []string, what string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%s %q: want KEY=VALUE", what, kv)
		}
		m[k] = v
	}
	return m, nil
}

// printJSON writes v indented, for `-o json` and `show`.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// isTerminal reports whether f is a terminal (progress bars and raw mode need one).
func isTerminal(f *os.File) bool { return term.IsTerminal(int(f.Fd())) }

// humanBytes prints a byte count in IEC units with one decimal.
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
