package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// The agents' file tools on the command line: find, grep, stat, edit, watch.

func init() {
	register("find", command{summary: "list entries below LEASE:DIR by glob, type and depth", usage: findUsage, run: runFind})
	register("grep", command{summary: "search files below LEASE:PATH for a regexp or fixed string", usage: grepUsage, run: runGrep})
	register("stat", command{summary: "describe LEASE:PATH (type, size, mode, owner, mtime, link target, etag)", usage: statUsage, run: runStat})
	register("edit", command{summary: "replace exact text in LEASE:PATH atomically (--old, --new)", usage: editUsage, run: runEdit})
	register("watch", command{summary: "print changes below LEASE:DIR as they happen", usage: watchUsage, run: runWatch})
}

// leaseTarget opens the lease of a LEASE:PATH argument.
func leaseTarget(arg, usage string) (*client.Lease, string, error) {
	id, p, ok := remoteArg(arg)
	if !ok {
		return nil, "", usageError{usage}
	}
	c, err := newClient("")
	if err != nil {
		return nil, "", err
	}
	return c.OpenLease(id, ""), p, nil
}

func treeFlags(fs *flag.FlagSet, o *client.TreeOptions, globs, exclude *multiFlag) {
	fs.Var(globs, "name", "`GLOB` the path must match (repeatable; without / it matches the name at any depth; ** for any directories)")
	fs.Var(exclude, "exclude", "`GLOB` of paths to leave out, directories included (repeatable)")
	fs.IntVar(&o.MaxDepth, "maxdepth", 0, "levels to descend (0: no limit)")
	fs.BoolVar(&o.Hidden, "hidden", false, "include names starting with a dot")
	fs.BoolVar(&o.GitIgnore, "gitignore", false, "honour .gitignore files")
}

const findUsage = "usage: sidecar find [--name GLOB] [--exclude GLOB] [--type f|d|l|o] [--maxdepth N] [--hidden] [--gitignore] [--limit N] [--all] [-l] [-o json] LEASE:DIR"

func runFind(ctx context.Context, args []string) error {
	fs := newFlagSet("find")
	var o client.FindOptions
	var globs, exclude multiFlag
	treeFlags(fs, &o.TreeOptions, &globs, &exclude)
	typ := fs.String("type", "", "f (file), d (dir), l (symlink) or o (other)")
	fs.IntVar(&o.Limit, "limit", 0, "entries per request (0: the daemon's default, 1000)")
	all := fs.Bool("all", false, "follow truncated results to the end")
	long := fs.Bool("l", false, "show type, size, mode and mtime")
	out := outputFlag(fs, "text", "json")
	pos, err := operands(fs, args, 1, findUsage)
	if err != nil {
		return err
	}
	o.Globs, o.Exclude, o.Stat = globs, exclude, *long
	switch *typ {
	case "":
	case "f", "d", "l", "o":
		o.Type = map[string]string{"f": "file", "d": "dir", "l": "symlink", "o": "other"}[*typ]
	default:
		return usageError{"find: --type must be f, d, l or o"}
	}
	l, dir, err := leaseTarget(pos[0], findUsage)
	if err != nil {
		return err
	}
	var res apitype.FindResult
	for {
		page, err := l.Find(ctx, dir, o)
		if err != nil {
			return err
		}
		res.Entries = append(res.Entries, page.Entries...)
		res.Truncated, res.Reason, res.Next = page.Truncated, page.Reason, page.Next
		if !*all || !page.Truncated || page.Reason != "limit" {
			break
		}
		o.After = page.Next
	}
	if out.json() {
		return printJSON(os.Stdout, res)
	}
	for _, e := range res.Entries {
		switch {
		case *long:
			fmt.Printf("%-7s %s %10d %s %s", e.Type, e.Mode, e.Size, e.ModTime.UTC().Format("2006-01-02T15:04:05Z"), e.Path)
			if e.Target != "" {
				fmt.Printf(" -> %s", e.Target)
			}
			fmt.Println()
		default:
			fmt.Println(e.Path)
		}
	}
	if res.Truncated {
		fmt.Fprintf(os.Stderr, "sidecar: find stopped at its %s limit; resume with the API's after=%q (or --all)\n", res.Reason, res.Next)
	}
	return nil
}

const grepUsage = "usage: sidecar grep [-F] [-i] [-C N] [-m N] [--name GLOB] [--exclude GLOB] [--hidden] [--gitignore] [--max-file-bytes N] [-o json] PATTERN LEASE:PATH"

func runGrep(ctx context.Context, args []string) error {
	fs := newFlagSet("grep")
	var o client.GrepOptions
	var globs, exclude multiFlag
	treeFlags(fs, &o.TreeOptions, &globs, &exclude)
	fs.BoolVar(&o.Fixed, "F", false, "PATTERN is a fixed string, not an RE2 regular expression")
	fs.BoolVar(&o.IgnoreCase, "i", false, "ignore case")
	fs.IntVar(&o.Context, "C", 0, "lines of context before and after each match (at most 10)")
	fs.IntVar(&o.MaxMatches, "m", 0, "matching lines at most (0: the daemon's default, 1000)")
	fs.Int64Var(&o.MaxFileBytes, "max-file-bytes", 0, "skip larger files (0: the daemon's default, 8 MiB)")
	out := outputFlag(fs, "text", "json")
	pos, err := operands(fs, args, 2, grepUsage)
	if err != nil {
		return err
	}
	o.Globs, o.Exclude = globs, exclude
	l, p, err := leaseTarget(pos[1], grepUsage)
	if err != nil {
		return err
	}
	res, err := l.Grep(ctx, p, pos[0], o)
	if err != nil {
		return err
	}
	if out.json() {
		if err := printJSON(os.Stdout, res); err != nil {
			return err
		}
	} else {
		printGrep(os.Stdout, res)
	}
	if res.Truncated {
		fmt.Fprintf(os.Stderr, "sidecar: grep stopped at its %s limit\n", res.Reason)
	}
	if len(res.Matches) == 0 {
		return exitError{code: 1} // as grep: nothing matched
	}
	return nil
}

// printGrep prints matches as grep -n does: path:line:text, context lines with "-".
func printGrep(w io.Writer, res apitype.GrepResult) {
	for _, m := range res.Matches {
		for i, b := range m.Before {
			fmt.Fprintf(w, "%s-%d-%s\n", m.Path, m.Line-len(m.Before)+i, b)
		}
		fmt.Fprintf(w, "%s:%d:%s\n", m.Path, m.Line, m.Text)
		for i, a := range m.After {
			fmt.Fprintf(w, "%s-%d-%s\n", m.Path, m.Line+1+i, a)
		}
		if len(m.Before)+len(m.After) > 0 {
			fmt.Fprintln(w, "--")
		}
	}
}

const statUsage = "usage: sidecar stat [-o json] LEASE:PATH"

func runStat(ctx context.Context, args []string) error {
	fs := newFlagSet("stat")
	out := outputFlag(fs, "text", "json")
	pos, err := operands(fs, args, 1, statUsage)
	if err != nil {
		return err
	}
	l, p, err := leaseTarget(pos[0], statUsage)
	if err != nil {
		return err
	}
	st, err := l.FileStat(ctx, p)
	if err != nil {
		return err
	}
	if out.json() {
		if err := printJSON(os.Stdout, st); err != nil {
			return err
		}
	} else if st.Exists {
		fmt.Printf("path:   %s\ntype:   %s\nsize:   %d\nmode:   %s\nowner:  %d:%d\nmtime:  %s\n", st.Path, st.Type, st.Size, st.Mode, st.UID, st.GID, st.ModTime.UTC().Format("2006-01-02T15:04:05.000000000Z"))
		if st.Target != "" {
			fmt.Printf("target: %s\n", st.Target)
		}
		if st.ETag != "" {
			fmt.Printf("etag:   %s\n", st.ETag)
		}
	} else {
		fmt.Printf("%s: does not exist\n", st.Path)
	}
	if !st.Exists {
		return exitError{code: 1}
	}
	return nil
}

const editUsage = "usage: sidecar edit --old TEXT --new TEXT [--all] [--if-match ETAG] LEASE:PATH"

func runEdit(ctx context.Context, args []string) error {
	fs := newFlagSet("edit")
	old := fs.String("old", "", "`TEXT` the exact text to replace (must occur once, unless --all)")
	newText := fs.String("new", "", "`TEXT` the replacement")
	all := fs.Bool("all", false, "replace every occurrence")
	ifMatch := fs.String("if-match", "", "only if the file still has this ETag (from sidecar stat)")
	pos, err := operands(fs, args, 1, editUsage)
	if err != nil {
		return err
	}
	if *old == "" {
		return usageError{editUsage}
	}
	l, p, err := leaseTarget(pos[0], editUsage)
	if err != nil {
		return err
	}
	res, err := l.Replace(ctx, p, *old, *newText, client.ReplaceOptions{All: *all, IfMatch: *ifMatch})
	if err != nil {
		return err
	}
	fmt.Printf("%d replacement%s; etag %s\n", res.Replacements, map[bool]string{true: "s"}[res.Replacements != 1], res.ETag)
	return nil
}

const watchUsage = "usage: sidecar watch [-r] [-o json] LEASE:DIR"

func runWatch(ctx context.Context, args []string) error {
	fs := newFlagSet("watch")
	var o client.WatchOptions
	fs.BoolVar(&o.Recursive, "r", false, "watch the directories below too")
	out := outputFlag(fs, "text", "json")
	pos, err := operands(fs, args, 1, watchUsage)
	if err != nil {
		return err
	}
	l, dir, err := leaseTarget(pos[0], watchUsage)
	if err != nil {
		return err
	}
	w, err := l.Watch(ctx, dir, o)
	if err != nil {
		return err
	}
	defer w.Close()
	fmt.Fprintf(os.Stderr, "watching %s\n", pos[0]) // every change from now on is reported
	stop := context.AfterFunc(ctx, func() { w.Close() })
	defer stop()
	for {
		e, err := w.Next()
		if errors.Is(err, io.EOF) || ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
		if out.json() {
			if err := printJSONLine(os.Stdout, e); err != nil {
				return err
			}
			continue
		}
		switch e.Type {
		case apitype.WatchRename:
			fmt.Printf("rename %s -> %s\n", e.OldPath, e.Path)
		case apitype.WatchOverflow:
			fmt.Printf("overflow %d events lost\n", e.Dropped)
		case apitype.WatchEnd:
			fmt.Printf("end %s\n", e.Reason)
		default:
			suffix := ""
			if e.Dir {
				suffix = "/"
			}
			fmt.Printf("%s %s%s\n", e.Type, e.Path, suffix)
		}
	}
}

func printJSONLine(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, string(b))
	return err
}
