package fsxfer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Limits of Find.
const (
	DefaultFindLimit   = 1000
	MaxFindLimit       = 100_000
	DefaultFindTimeout = 10 * time.Second
	MaxFindTimeout     = 60 * time.Second
)

// FindOptions select and bound a Find.
type FindOptions struct {
	TreeOptions
	Type    string        // "", "file", "dir", "symlink" or "other"
	After   string        // resume: only entries after this path (relative to the start), in walk order
	Limit   int           // entries returned; 0: DefaultFindLimit; at most MaxFindLimit
	Timeout time.Duration // 0: DefaultFindTimeout; at most MaxFindTimeout
	Stat    bool          // fill Info beyond Name and Type (size, mode, mtime, owner, link target): one stat per entry
}

// Found is one entry of a Find: Path is relative to the directory searched. Info has
// Name and Type, and the rest with FindOptions.Stat.
type Found struct {
	Path string
	Info
	Mount bool // a directory on another mount (listed, not entered)
}

// FindResult is the entries in walk order (by name, parents before their children).
// Truncated says the walk stopped at Limit or at Timeout; Next is the After that
// resumes it.
type FindResult struct {
	Entries   []Found
	Truncated bool
	Reason    string // "limit" or "time" when Truncated
	Next      string
}

func (o *FindOptions) normalize() error {
	switch o.Type {
	case "", "file", "dir", "symlink", "other":
	default:
		return fmt.Errorf("%w: type must be file, dir, symlink or other", ErrInvalid)
	}
	if err := cmp.Or(bound(&o.Limit, DefaultFindLimit, MaxFindLimit, fmt.Sprintf("limit must be 0..%d", MaxFindLimit)),
		bound(&o.Timeout, DefaultFindTimeout, MaxFindTimeout, "timeout must be at most "+MaxFindTimeout.String())); err != nil {
		return err
	}
	if o.After != "" {
		a, err := cleanPath(o.After, DefaultMaxNameBytes)
		if err != nil {
			return err
		}
		o.After = a
	}
	return nil
}

// bound refuses *v outside 0..max (ErrInvalid with msg), and makes 0 the default def.
func bound[T int | int64 | time.Duration](v *T, def, max T, msg string) error {
	if *v < 0 || *v > max {
		return fmt.Errorf("%w: %s", ErrInvalid, msg)
	}
	if *v == 0 {
		*v = def
	}
	return nil
}

// Find lists the entries below the directory p that match opts, bounded by a count and
// a time limit. Nothing is followed or entered that walkTree would not.
func (f *FS) Find(ctx context.Context, p string, opts FindOptions) (FindResult, error) {
	if err := opts.normalize(); err != nil {
		return FindResult{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	res := FindResult{Entries: []Found{}}
	var prune func(string) bool
	if opts.After != "" {
		// A directory wholly before the cursor need not be entered.
		prune = func(rel string) bool {
			return walkCompare(rel, opts.After) < 0 && !strings.HasPrefix(opts.After, rel+"/")
		}
	}
	visit := func(e *treeEntry) error {
		if opts.After != "" && walkCompare(e.rel, opts.After) <= 0 {
			return nil
		}
		if opts.Type != "" && typeName(e.mode) != opts.Type {
			return nil
		}
		if len(opts.Include) > 0 && !globMatch(opts.Include, e.rel) {
			return nil
		}
		if len(res.Entries) == opts.Limit {
			res.Truncated, res.Reason = true, "limit"
			return errStopWalk
		}
		info := Info{Name: e.name, Type: typeName(e.mode)}
		if opts.Stat {
			st := e.stat()
			if st == nil {
				return nil // removed meanwhile
			}
			target := ""
			if e.mode == unix.S_IFLNK {
				target, _ = readlinkAt(e.dir.fd, e.name)
			}
			info = infoFromStat(e.name, st, target)
		}
		res.Entries = append(res.Entries, Found{Path: e.rel, Info: info, Mount: e.mount})
		return nil
	}
	err := f.walkTree(ctx, p, opts.TreeOptions, visit, prune)
	if errors.Is(err, context.DeadlineExceeded) {
		res.Truncated, res.Reason, err = true, "time", nil
	}
	if err != nil {
		return FindResult{}, err
	}
	if res.Truncated && len(res.Entries) > 0 {
		res.Next = res.Entries[len(res.Entries)-1].Path
	} else if res.Truncated {
		res.Next = opts.After
	}
	return res, nil
}

// walkCompare orders paths as the walk visits them: element by element, by name.
func walkCompare(a, b string) int {
	for {
		ea, ra, moreA := strings.Cut(a, "/")
		eb, rb, moreB := strings.Cut(b, "/")
		if c := strings.Compare(ea, eb); c != 0 {
			return c
		}
		switch {
		case !moreA && !moreB:
			return 0
		case !moreA:
			return -1
		case !moreB:
			return 1
		}
		a, b = ra, rb
	}
}
