package fsxfer

import (
	"errors"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// clean validates a lease path and returns it in the form os.Root expects: relative,
// slash-separated, without empty or "." elements; the workdir itself is ".".
// "..", absolute paths and NUL bytes are ErrOutside: a path names something inside the
// workdir by its own elements or not at all. The one absolute form accepted is the
// workdir's own name, Config.Mount, and what is under it: the paths lease processes print.
func (f *FS) clean(p string) (string, error) {
	m := f.cfg.Mount
	if m == "" || strings.IndexByte(p, 0) >= 0 {
		return cleanPath(p, f.cfg.MaxNameBytes)
	}
	if p == m {
		return ".", nil
	}
	rest, ok := strings.CutPrefix(p, m+"/")
	if !ok {
		return cleanPath(p, f.cfg.MaxNameBytes)
	}
	rel, err := cleanPath("./"+rest, f.cfg.MaxNameBytes) // "./": "/workspace//x" is x
	var pe *pathError
	if errors.As(err, &pe) && pe.path != "" {
		pe.path = shorten(p) // the path as the caller gave it
	}
	return rel, err
}

func cleanPath(p string, maxBytes int) (string, error) {
	if strings.IndexByte(p, 0) >= 0 {
		return "", &pathError{op: "resolve", path: "", err: ErrOutside, cause: errNUL}
	}
	if len(p) > maxBytes {
		return "", &pathError{op: "resolve", path: shorten(p), err: ErrNameTooLong}
	}
	if strings.HasPrefix(p, "/") {
		return "", &pathError{op: "resolve", path: p, err: ErrOutside}
	}
	elems := make([]string, 0, strings.Count(p, "/")+1)
	for e := range strings.SplitSeq(p, "/") {
		switch {
		case e == "" || e == ".":
		case e == "..":
			return "", &pathError{op: "resolve", path: p, err: ErrOutside}
		case len(e) > maxNameElem:
			return "", &pathError{op: "resolve", path: p, err: ErrNameTooLong}
		default:
			elems = append(elems, e)
		}
	}
	if len(elems) == 0 {
		return ".", nil
	}
	return strings.Join(elems, "/"), nil
}

var errNUL = errors.New("NUL byte in path")

// openDir opens the directory rel through the root without blocking (a FIFO in its
// place is refused, never opened for reading).
func (f *FS) openDir(rel string) (*os.File, error) {
	d, err := f.root.OpenFile(rel, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, wrap("open", rel, err)
	}
	return d, nil
}

// openCleanDir cleans the workdir path p and opens it as a directory.
func (f *FS) openCleanDir(p string) (rel string, d *os.File, err error) {
	if rel, err = f.clean(p); err != nil {
		return "", nil, err
	}
	d, err = f.openDir(rel)
	return rel, d, err
}

// openParent opens the directory holding rel (symlinks on the way are followed inside the
// root) and returns it with the last element, which callers handle with *at system calls
// so that it is never followed. rel must not be ".".
func (f *FS) openParent(rel string) (dir *os.File, base string, err error) {
	d, err := f.openDir(path.Dir(rel))
	if err != nil {
		return nil, "", err
	}
	return d, path.Base(rel), nil
}

// fd is the descriptor of an open directory; the *os.File must outlive its use.
func fd(d *os.File) int { return int(d.Fd()) }

// shorten keeps error messages about absurdly long paths readable.
func shorten(p string) string {
	if len(p) <= 64 {
		return p
	}
	return p[:64] + "…"
}
