package fsxfer

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"golang.org/x/sys/unix"
)

// ETag names one version of a file: its modification time and size. Every write the
// daemon makes replaces the file (a new mtime), so a stale ETag never matches a newer
// version written through the API; a lease process that rewrites a file within the
// same nanosecond at the same size is the blind spot.
func (i Info) ETag() string {
	return fmt.Sprintf(`"%x-%x"`, i.ModTime.UnixNano(), i.Size)
}

// checkIfMatch compares the file name in dirfd with an If-Match value: "" accepts
// anything, "*" any existing file, otherwise one of the listed ETags (comma-separated,
// weak ones compared weakly).
func checkIfMatch(dirfd int, name, ifMatch string) error {
	if ifMatch == "" {
		return nil
	}
	var st unix.Stat_t
	err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return ErrPrecondition
	}
	if err != nil {
		return err
	}
	if strings.TrimSpace(ifMatch) == "*" {
		return nil
	}
	cur := infoFromStat(name, &st, "").ETag()
	for tag := range strings.SplitSeq(ifMatch, ",") {
		if strings.TrimPrefix(strings.TrimSpace(tag), "W/") == cur {
			return nil
		}
	}
	return ErrPrecondition
}

// MaxEditBytes bounds the file an exact replacement reads into memory.
const MaxEditBytes = 64 << 20

// ReplaceOptions describe an exact replacement.
type ReplaceOptions struct {
	Old, New string
	All      bool   // replace every occurrence; otherwise Old must occur exactly once
	IfMatch  string // as WriteOptions.IfMatch
}

// Replace replaces Old by New in the regular file at p and writes the result
// atomically (WriteFile's path: temporary file, fsync, rename), keeping the file's
// mode. Old absent is ErrNoMatch; found more than once without All, ErrAmbiguous; in
// both cases, and on ErrPrecondition, the file is untouched. It returns the number of
// replacements and the new file's Info.
func (f *FS) Replace(ctx context.Context, p string, o ReplaceOptions) (int, Info, error) {
	if o.Old == "" {
		return 0, Info{}, fmt.Errorf("%w: old text must not be empty", ErrInvalid)
	}
	h, err := f.Open(p)
	if err != nil {
		return 0, Info{}, err
	}
	info := h.Info()
	if info.Size > MaxEditBytes {
		h.Close()
		return 0, Info{}, wrap("replace", p, fmt.Errorf("%w: file over %d bytes", ErrTooLarge, MaxEditBytes))
	}
	data, err := io.ReadAll(io.LimitReader(h, MaxEditBytes+1))
	h.Close()
	if err != nil {
		return 0, Info{}, wrap("replace", p, err)
	}
	if o.IfMatch != "" && o.IfMatch != "*" && !etagListed(o.IfMatch, info.ETag()) {
		return 0, Info{}, wrap("replace", p, ErrPrecondition)
	}
	n := bytes.Count(data, []byte(o.Old))
	switch {
	case n == 0:
		return 0, Info{}, wrap("replace", p, ErrNoMatch)
	case n > 1 && !o.All:
		return 0, Info{}, wrap("replace", p, fmt.Errorf("%w (%d times)", ErrAmbiguous, n))
	}
	out := bytes.ReplaceAll(data, []byte(o.Old), []byte(o.New))
	// The rename happens only if the file is still the version read above.
	if _, err := f.WriteFile(ctx, p, bytes.NewReader(out), WriteOptions{Mode: info.Mode.Perm(), IfMatch: info.ETag()}); err != nil {
		return 0, Info{}, err
	}
	ni, err := f.Stat(p)
	return n, ni, err
}

func etagListed(list, tag string) bool {
	for t := range strings.SplitSeq(list, ",") {
		if strings.TrimPrefix(strings.TrimSpace(t), "W/") == tag {
			return true
		}
	}
	return false
}

// Lines is a slice of a text file by lines.
type Lines struct {
	Data  []byte // the lines, each with its newline (the file's last line may lack one)
	Count int    // lines in Data
	More  bool   // the file has lines after these
	Info  Info   // of the file read
}

// Limits of ReadLines.
const (
	MaxReadLines     = 100_000
	MaxReadLineBytes = 16 << 20 // of Data: the slice stops before the line that would pass it
)

// ReadLines returns up to limit lines of the regular file at p, starting after offset
// lines (0 is the first line). Data is bounded by MaxReadLineBytes: when one line is
// longer, it alone is returned, cut, with More set.
func (f *FS) ReadLines(p string, offset, limit int) (Lines, error) {
	if offset < 0 || limit < 0 || limit > MaxReadLines {
		return Lines{}, fmt.Errorf("%w: line offset must be >= 0 and limit 0..%d", ErrInvalid, MaxReadLines)
	}
	if limit == 0 {
		limit = MaxReadLines
	}
	h, err := f.Open(p)
	if err != nil {
		return Lines{}, err
	}
	defer h.Close()
	r := bufio.NewReaderSize(h, 64<<10)
	for skipped := 0; skipped < offset; {
		_, err := r.ReadSlice('\n')
		if err == io.EOF {
			return Lines{Data: []byte{}, Info: h.Info()}, nil
		}
		if err == nil {
			skipped++
		} else if !errors.Is(err, bufio.ErrBufferFull) {
			return Lines{}, wrap("read", p, err)
		}
	}
	out := Lines{Data: []byte{}, Info: h.Info()}
	var cur []byte // one line; ReadSlice's result is only valid until the next read
	for out.Count < limit {
		line, err := r.ReadSlice('\n')
		cur = append(cur[:0], line...)
		for errors.Is(err, bufio.ErrBufferFull) && len(out.Data)+len(cur) <= MaxReadLineBytes {
			line, err = r.ReadSlice('\n')
			cur = append(cur, line...)
		}
		if len(out.Data)+len(cur) > MaxReadLineBytes {
			if out.Count == 0 {
				out.Data, out.Count = cur[:MaxReadLineBytes], 1
			}
			out.More = true
			return out, nil
		}
		out.Data = append(out.Data, cur...)
		if len(cur) > 0 {
			out.Count++
		}
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return Lines{}, wrap("read", p, err)
		}
	}
	_, err = r.Peek(1)
	out.More = err == nil
	return out, nil
}
