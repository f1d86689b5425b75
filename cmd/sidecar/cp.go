package main

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"

	"github.com/sidecar-sandbox/sidecar/client"
)

func init() {
	register("cp", command{summary: "copy files or directories into or out of a lease (LOCAL LEASE:PATH or LEASE:PATH LOCAL)",
		usage: cpUsage, run: runCp})
}

const cpUsage = "usage: sidecar cp [-z] LOCAL LEASE:PATH | sidecar cp [-z] LEASE:PATH LOCAL"

// remoteArg splits LEASE:PATH. A colon after a slash, or none, makes a local path
// (write ./a:b for a local name with a colon).
func remoteArg(arg string) (lease, p string, ok bool) {
	i := strings.IndexByte(arg, ':')
	if i <= 0 || strings.ContainsRune(arg[:i], '/') {
		return "", "", false
	}
	p = arg[i+1:]
	if p == "" {
		p = "."
	}
	return arg[:i], p, true
}

// copySpec is one parsed `cp`: exactly one side is in a lease.
type copySpec struct {
	lease    string
	remote   string
	local    string
	upload   bool
	compress bool
}

func parseCp(args []string) (copySpec, error) {
	fs := newFlagSet("cp")
	z := fs.Bool("z", false, "compress directory transfers (gzip; helps on slow links only)")
	pos, err := operands(fs, args, 2, cpUsage)
	if err != nil {
		return copySpec{}, err
	}
	srcLease, srcPath, srcRemote := remoteArg(pos[0])
	dstLease, dstPath, dstRemote := remoteArg(pos[1])
	switch {
	case srcRemote && dstRemote:
		return copySpec{}, usagef("cp: both sides are in a lease; one must be local")
	case !srcRemote && !dstRemote:
		return copySpec{}, usagef("cp: neither side is LEASE:PATH")
	case dstRemote:
		return copySpec{lease: dstLease, remote: dstPath, local: pos[0], upload: true, compress: *z}, nil
	default:
		return copySpec{lease: srcLease, remote: srcPath, local: pos[1], compress: *z}, nil
	}
}

func runCp(ctx context.Context, args []string) error {
	spec, err := parseCp(args)
	if err != nil {
		return err
	}
	c, err := newClient("")
	if err != nil {
		return err
	}
	l := c.OpenLease(spec.lease, "")
	if spec.upload {
		return upload(ctx, l, spec)
	}
	return download(ctx, l, spec)
}

// newBar is a byte progress bar on a terminal's stderr, or nil (quiet) elsewhere.
// total -1 shows a spinner.
func newBar(total int64, what string) *progressbar.ProgressBar {
	if !isTerminal(os.Stderr) {
		return nil
	}
	return progressbar.NewOptions64(total,
		progressbar.OptionSetWriter(os.Stderr),
		progressbar.OptionSetDescription(what),
		progressbar.OptionShowBytes(true),
		progressbar.OptionUseIECUnits(true),
		progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionShowCount(),
		progressbar.OptionOnCompletion(func() { fmt.Fprintln(os.Stderr) }),
	)
}

func setBar(bar *progressbar.ProgressBar) func(int64) {
	if bar == nil {
		return nil
	}
	return func(n int64) { _ = bar.Set64(n) }
}

func finishBar(bar *progressbar.ProgressBar) {
	if bar != nil {
		_ = bar.Finish()
	}
}

// remoteTarget puts a source inside dst when dst is (or is written as) a directory.
func remoteTarget(ctx context.Context, l *client.Lease, dst, srcName string) string {
	if strings.HasSuffix(dst, "/") || dst == "." {
		return path.Join(dst, srcName)
	}
	if st, err := l.Stat(ctx, dst); err == nil && st.Type == "dir" {
		return path.Join(dst, srcName)
	}
	return dst
}

func upload(ctx context.Context, l *client.Lease, spec copySpec) error {
	fi, err := os.Stat(spec.local)
	if err != nil {
		return err
	}
	dst := remoteTarget(ctx, l, spec.remote, filepath.Base(spec.local))
	if fi.IsDir() {
		bar := newBar(treeSize(spec.local), filepath.Base(spec.local))
		opts := []client.DirOption{client.WithProgress(setBar(bar))}
		if spec.compress {
			opts = append(opts, client.WithCompression("gzip"))
		}
		err := l.UploadDir(ctx, spec.local, dst, opts...)
		if err == nil {
			finishBar(bar)
		}
		return err
	}
	f, err := os.Open(spec.local)
	if err != nil {
		return err
	}
	defer f.Close()
	bar := newBar(fi.Size(), filepath.Base(spec.local))
	opts := client.UploadOptions{Mode: fi.Mode().Perm(), MkdirAll: true}
	if bar != nil {
		opts.Progress = func(sent, _ int64) { _ = bar.Set64(sent) }
	}
	if err := l.Upload(ctx, dst, f, fi.Size(), opts); err != nil {
		return err
	}
	finishBar(bar)
	return nil
}

// treeSize sums the regular files under dir, for the progress bar's total.
func treeSize(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// localTarget puts a source inside dst when dst is an existing directory.
func localTarget(dst, srcName string) string {
	if fi, err := os.Stat(dst); err == nil && fi.IsDir() {
		return filepath.Join(dst, srcName)
	}
	return dst
}

func download(ctx context.Context, l *client.Lease, spec copySpec) error {
	st, err := l.Stat(ctx, spec.remote)
	if err != nil {
		return err
	}
	name := path.Base(spec.remote)
	if name == "." || name == "/" {
		name = spec.lease
	}
	dst := localTarget(spec.local, name)
	if st.Type == "dir" {
		bar := newBar(-1, name)
		opts := []client.DirOption{client.WithProgress(setBar(bar))}
		if spec.compress {
			opts = append(opts, client.WithCompression("gzip"))
		}
		err := l.DownloadDir(ctx, spec.remote, dst, opts...)
		if err == nil {
			finishBar(bar)
		}
		return err
	}
	// Write beside the target and rename: an interrupted copy leaves no partial file.
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".sidecar-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	bar := newBar(st.Size, name)
	var w io.Writer = tmp
	if bar != nil {
		w = &progressWriter{w: tmp, bar: bar}
	}
	if _, err := l.Download(ctx, spec.remote, w); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if mode, err := parseMode(st.Mode); err == nil {
		_ = os.Chmod(tmp.Name(), mode)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return err
	}
	finishBar(bar)
	return nil
}

type progressWriter struct {
	w   io.Writer
	bar *progressbar.ProgressBar
}

func (p *progressWriter) Write(b []byte) (int, error) {
	n, err := p.w.Write(b)
	_ = p.bar.Add(n)
	return n, err
}

// parseMode reads an octal permission string such as "0644".
func parseMode(s string) (os.FileMode, error) {
	var m uint32
	if _, err := fmt.Sscanf(s, "%o", &m); err != nil || m > 0o7777 {
		return 0, fmt.Errorf("bad mode %q", s)
	}
	return os.FileMode(m).Perm(), nil
}
