package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// The CLI's flag conventions, as docker and kubectl users expect them: one-letter flags
// take one dash and bundle (-it is -i -t), longer ones are shown with two dashes (one
// is accepted too), flags go anywhere before "--" (exec and shells run: before the
// command), and --help lists every flag.

// globals are the flags every command that talks to a daemon takes, before the command
// name or among its own flags: which daemon (clientenv.go applies them).
var globals struct {
	url, context string
}

// newFlagSet is a command's flag set with the global flags; usage is what --help prints
// above the flags (default: the command's registered usage).
func newFlagSet(name string, usage ...string) *flag.FlagSet {
	fs := newLocalFlagSet(name, usage...)
	addGlobalFlags(fs)
	return fs
}

// newLocalFlagSet is newFlagSet for a command that talks to no daemon (serve, token, tls).
func newLocalFlagSet(name string, usage ...string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	text := strings.Join(usage, "\n")
	if text == "" {
		text = commands[name].usage
	}
	if text == "" {
		text = "usage: sidecar " + name + "\n\n" + commands[name].summary
	}
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintln(w, strings.TrimRight(text, "\n"))
		writeFlags(w, fs)
	}
	return fs
}

func addGlobalFlags(fs *flag.FlagSet) {
	fs.StringVar(&globals.url, "url", globals.url, "`URL` the daemon's https:// URL (wins over SANDBOX_REMOTE_URL and the context)")
	fs.StringVar(&globals.context, "context", globals.context, "`NAME` the daemon named by sidecar context add (its URL, token file and CA file)")
}

// writeFlags lists fs's flags under a "flags:" heading: -x for one letter, --name for more.
func writeFlags(w io.Writer, fs *flag.FlagSet) {
	n, global := 0, false
	fs.VisitAll(func(f *flag.Flag) {
		if isGlobalFlag(f.Name) {
			global = true
		} else {
			n++
		}
	})
	if n > 0 {
		fmt.Fprintln(w, "\nflags:")
		writeFlagList(w, fs, func(name string) bool { return !isGlobalFlag(name) })
	}
	if global {
		fmt.Fprintln(w, "\nglobal flags:")
		writeFlagList(w, fs, isGlobalFlag)
	}
}

func isGlobalFlag(name string) bool { return name == "url" || name == "context" }

func writeFlagList(w io.Writer, fs *flag.FlagSet, want func(string) bool) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fs.VisitAll(func(f *flag.Flag) {
		if !want(f.Name) {
			return
		}
		arg, usage := flagArg(f)
		left := flagName(f.Name)
		if arg != "" {
			left += " " + strings.ToUpper(arg)
		}
		switch f.DefValue {
		case "", "0", "false", "0s", "[]":
		default:
			usage += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		fmt.Fprintf(tw, "  %s\t%s\n", left, usage)
	})
	_ = tw.Flush()
}

// flagArg is the name of f's value and its description: a usage that starts with a
// back-quoted word names the value ("`DIR` working directory"), as flag.UnquoteUsage
// does for a quoted word anywhere.
func flagArg(f *flag.Flag) (string, string) {
	if rest, ok := strings.CutPrefix(f.Usage, "`"); ok {
		if arg, text, ok := strings.Cut(rest, "`"); ok {
			return arg, strings.TrimSpace(text)
		}
	}
	return flag.UnquoteUsage(f)
}

// flagName is how a flag is written: -x or --name.
func flagName(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// expandBundles splits bundled one-letter boolean flags (-it into -i -t) in the flags at
// the front of args, up to the first non-flag argument or "--": what follows is an
// operand or a remote command whose own flags must stay as they are.
func expandBundles(fs *flag.FlagSet, args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" || len(a) < 2 || a[0] != '-' {
			return append(out, args[i:]...)
		}
		name := strings.TrimLeft(a, "-")
		name, _, hasValue := strings.Cut(name, "=")
		if f := fs.Lookup(name); f != nil {
			out = append(out, a)
			if !hasValue && !isBoolFlag(f) && i+1 < len(args) {
				i++ // the flag's value, whatever it looks like
				out = append(out, args[i])
			}
			continue
		}
		if bundle, ok := splitBundle(fs, a); ok {
			out = append(out, bundle...)
			if last := fs.Lookup(bundle[len(bundle)-1][1:]); !isBoolFlag(last) && i+1 < len(args) {
				i++
				out = append(out, args[i])
			}
			continue
		}
		out = append(out, a) // unknown: fs.Parse reports it
	}
	return out
}

// splitBundle reads "-abc" as "-a -b -c" when a and b are boolean one-letter flags of fs
// and c is any one-letter flag (a value flag last takes the next argument).
func splitBundle(fs *flag.FlagSet, a string) ([]string, bool) {
	if strings.HasPrefix(a, "--") || strings.Contains(a, "=") {
		return nil, false
	}
	letters := a[1:]
	var out []string
	for i, r := range letters {
		f := fs.Lookup(string(r))
		if f == nil || (!isBoolFlag(f) && i != len(letters)-1) {
			return nil, false
		}
		out = append(out, "-"+string(r))
	}
	return out, true
}

func isBoolFlag(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}
