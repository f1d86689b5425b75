// Package disk bounds what a lease can write with the kernel, not with a meter: each lease
// directory (WorkRoot/<id>, which holds the workdir, the private /tmp and partial uploads)
// is the mount point of a filesystem of its own, an ext4 image on a loop device whose size
// is the lease's disk quota. A process writing past it gets ENOSPC, and the sparse image
// costs the host at most its size.
//
// Images are clones of one formatted template per size (template.go), and those of the
// default size are made ahead of time in the background (pool.go), so an acquire only
// attaches and mounts one. Mounts outlive the daemon: after a restart
// Attach adopts the mount already on a lease directory, and Sweep removes what belongs to
// leases the daemon no longer knows. Detach unmounts (lazily if something still holds the
// filesystem), detaches the loop device and deletes the image; only then may the caller
// remove the directory, which is then an empty mount point.
package disk

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// Modes: what the operator asks for (SIDECAR_DISK_QUOTA) and what Mode reports.
const (
	ModeAuto = "auto" // loop when the host can, else New fails (strict) or falls back to off
	ModeLoop = "loop" // a per-lease ext4 image on a loop device; New fails if the host cannot
	ModeOff  = "off"  // no kernel bound: only the API meter of fsxfer guards uploads
)

// MinBytes is the smallest filesystem made: ext4 needs room for its own metadata. A lease
// asking for less gets this much from the kernel (the API meter still holds it to its
// quota for uploads).
const MinBytes = 8 << 20

// DefaultPoolSize is how many formatted images of the default size are kept ready.
const DefaultPoolSize = 2

// ErrUnavailable: the host cannot give leases a filesystem of their own.
var ErrUnavailable = errors.New("disk quota unavailable")

// Config configures Quotas.
type Config struct {
	Mode     string // ModeAuto (default), ModeLoop or ModeOff
	WorkRoot string // lease directories are WorkRoot/<id>; required
	// ImageDir holds the images (<id>.img) and the pool (pool/); default
	// WorkRoot/.disk. It must be on a filesystem that supports sparse files.
	ImageDir string
	// DefaultBytes is the size of pooled images (the default disk quota); 0: no pool.
	DefaultBytes int64
	PoolSize     int // images kept ready; 0 → DefaultPoolSize, < 0 → none
	// MaxLeases is the most leases at once: New logs (info) when that many default-sized
	// images could outgrow the free space under ImageDir (images are sparse, so the
	// quotas may add up to more than the disk; a lease whose image cannot grow sees I/O
	// errors instead of ENOSPC).
	MaxLeases int
	// Strict refuses ModeAuto on a host where no mechanism holds; otherwise auto falls
	// back to off, loudly.
	Strict bool
	Logger *slog.Logger
}

// Quotas gives leases their filesystems. It is safe for concurrent use.
type Quotas struct {
	cfg  Config
	mode string
	log  *slog.Logger
	tpl  *templates
	pool *pool // nil without a pool
}

var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$`)

// New probes the host for the mechanism cfg.Mode asks for. In loop mode (or auto) it
// makes, mounts and removes a test filesystem, so a host where loop devices or
// mounts are refused (a container without the capability) is found now, not at the
// first acquire.
func New(ctx context.Context, cfg Config) (*Quotas, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Mode == "" {
		cfg.Mode = ModeAuto
	}
	if cfg.WorkRoot == "" || !filepath.IsAbs(cfg.WorkRoot) {
		return nil, fmt.Errorf("disk: WorkRoot must be an absolute path, got %q", cfg.WorkRoot)
	}
	cfg.WorkRoot = filepath.Clean(cfg.WorkRoot)
	if cfg.ImageDir == "" {
		cfg.ImageDir = filepath.Join(cfg.WorkRoot, ".disk")
	}
	if cfg.PoolSize == 0 {
		cfg.PoolSize = DefaultPoolSize
	}
	q := &Quotas{cfg: cfg, log: cfg.Logger}
	switch cfg.Mode {
	case ModeOff:
		q.mode = ModeOff
		q.log.Warn("DISK QUOTA IS OFF: lease processes can fill the work root's filesystem; only API uploads are metered",
			"disk_quota", ModeOff)
		return q, nil
	case ModeAuto, ModeLoop:
	default:
		return nil, fmt.Errorf("disk: mode %q (want auto, loop or off)", cfg.Mode)
	}
	if err := q.probeLoop(ctx); err != nil {
		if cfg.Mode == ModeLoop || cfg.Strict {
			return nil, fmt.Errorf("%w: %v (set SIDECAR_DISK_QUOTA=off to run without a kernel-enforced disk quota)", ErrUnavailable, err)
		}
		q.mode = ModeOff
		q.log.Warn("DISK QUOTA IS OFF: the host cannot give leases a filesystem of their own; lease processes can fill the work root's filesystem",
			"disk_quota", ModeOff, "reason", err.Error())
		return q, nil
	}
	q.mode = ModeLoop
	q.logOvercommit()
	if cfg.DefaultBytes > 0 && cfg.PoolSize > 0 {
		q.pool = newPool(q, max(cfg.DefaultBytes, MinBytes), cfg.PoolSize)
	}
	return q, nil
}

// logOvercommit says, at info, when MaxLeases images of the default size could fill the
// disk that holds them. Not a warning: the images are sparse by design, and the shipped
// defaults (64 leases of 10 GiB) exceed most disks, so a warning would greet every default
// start without anything being wrong; the figures are there for an operator sizing the host.
func (q *Quotas) logOvercommit() {
	var fs unix.Statfs_t
	if q.cfg.MaxLeases <= 0 || q.cfg.DefaultBytes <= 0 {
		return
	}
	// Before the first image the image dir may not exist yet: its parent, the work
	// root, is then on the same filesystem by default.
	if unix.Statfs(q.cfg.ImageDir, &fs) != nil && unix.Statfs(q.cfg.WorkRoot, &fs) != nil {
		return
	}
	free := int64(fs.Bavail) * fs.Bsize
	if need := int64(q.cfg.MaxLeases) * q.cfg.DefaultBytes; need > free {
		q.log.Info("lease disk quotas exceed the work root's free space (images are sparse): leases that all fill their quota would run out, and a lease whose image cannot grow gets I/O errors instead of ENOSPC",
			"max_leases", q.cfg.MaxLeases, "default_disk_bytes", q.cfg.DefaultBytes, "need_bytes", need, "free_bytes", free)
	}
}

// Mode is the mechanism in force: ModeLoop or ModeOff.
func (q *Quotas) Mode() string { return q.mode }

// Close stops the pool's background work; mounts and images stay for the next run.
func (q *Quotas) Close() error {
	if q.pool != nil {
		q.pool.close()
	}
	return nil
}

func (q *Quotas) imagePath(id string) string { return filepath.Join(q.cfg.ImageDir, id+".img") }

// leaseID checks that dir is a lease directory, WorkRoot/<id>, and returns the id.
func (q *Quotas) leaseID(dir string) (string, error) {
	id := filepath.Base(dir)
	if filepath.Clean(dir) != dir || filepath.Dir(dir) != q.cfg.WorkRoot || !idPattern.MatchString(id) {
		return "", fmt.Errorf("disk: %q is not a lease directory under %s", dir, q.cfg.WorkRoot)
	}
	return id, nil
}

// Attach gives the lease directory dir a filesystem of bytes (at least MinBytes). dir
// must exist; when new it must be empty, because the mount hides what it holds. A dir
// that already carries its lease's mount (a restart) is adopted as it is, and an image
// left without its mount (a host reboot) is mounted again. bytes == 0 means no quota, and
// mode off attaches nothing.
func (q *Quotas) Attach(ctx context.Context, dir string, bytes int64) error {
	id, err := q.leaseID(dir)
	if err != nil {
		return err
	}
	if q.mode == ModeOff || bytes <= 0 {
		return nil
	}
	bytes = max(bytes, MinBytes)
	m, mounted, err := mountAt(dir)
	if err != nil {
		return err
	}
	img := q.imagePath(id)
	if mounted {
		if !q.ours(m, img) {
			return fmt.Errorf("disk: %s is already a mount point of %s, not of the lease's image", dir, m.Source)
		}
		q.log.DebugContext(ctx, "lease filesystem adopted", "lease", id, "device", m.Source)
		return nil
	}
	if err := os.MkdirAll(q.cfg.ImageDir, 0o700); err != nil {
		return fmt.Errorf("disk: image dir: %w", err)
	}
	fresh := false
	var ahead *os.File // the image's filesystem, mounted ahead by the pool
	if _, err := os.Lstat(img); errors.Is(err, os.ErrNotExist) {
		if ahead, err = q.newImage(ctx, img, bytes); err != nil {
			return err
		}
		fresh = true
	} else if err != nil {
		return fmt.Errorf("disk: %w", err)
	}
	if ahead != nil {
		err := moveMount(ahead, dir)
		_ = ahead.Close()
		if err == nil {
			return nil
		}
		q.log.WarnContext(ctx, "cannot move a pooled filesystem onto a lease; mounting its image", "lease", id, "err", err)
		fresh = false // its loop device may still be bound: mountImage goes through it
	}
	if err := mountImage(img, dir, fresh); err != nil {
		if fresh {
			_ = os.Remove(img)
		}
		return fmt.Errorf("disk: lease %s: %w", id, err)
	}
	if fresh {
		// mkfs makes lost+found; a lease has no use for it and it would count as usage.
		_ = os.Remove(filepath.Join(dir, "lost+found"))
	}
	return nil
}

// newImage makes img of size bytes: a pooled one when the size matches, with its
// filesystem when the pool mounted it ahead (the caller moves it into place and closes
// it), else one made now.
func (q *Quotas) newImage(ctx context.Context, img string, bytes int64) (*os.File, error) {
	if q.pool != nil && q.pool.size == bytes {
		if r := q.pool.take(); r.path != "" {
			if err := os.Rename(r.path, img); err == nil {
				return r.mnt, nil
			}
			if r.mnt != nil {
				_ = r.mnt.Close()
			}
			_ = os.Remove(r.path)
		}
	}
	return nil, q.tpl.format(ctx, img, bytes)
}

// ours reports whether the mount m is of the loop device backing img.
func (q *Quotas) ours(m *mountinfo.Info, img string) bool {
	if !strings.HasPrefix(m.Source, "/dev/loop") {
		return false
	}
	backing, err := loopBacking(m.Source)
	return err == nil && backing == img
}

// Detach undoes Attach: unmount dir (lazily when the filesystem is still busy), detach its
// loop device and delete the image. It is idempotent. It refuses a mount on dir that is
// not the lease's own: the caller must then not remove dir. Whatever the mode, so that a
// daemon restarted with quotas off still releases the filesystems of an earlier run.
func (q *Quotas) Detach(ctx context.Context, dir string) error {
	id, err := q.leaseID(dir)
	if err != nil {
		return err
	}
	img := q.imagePath(id)
	m, mounted, err := mountAt(dir)
	if err != nil {
		return err
	}
	if mounted {
		if !q.ours(m, img) {
			return fmt.Errorf("disk: %s is a mount point of %s, not of the lease's image: left alone", dir, m.Source)
		}
		if err := unmount(dir); err != nil {
			return fmt.Errorf("disk: lease %s: %w", id, err)
		}
	}
	// The device was attached with autoclear: it detaches when the filesystem's last user
	// goes. detachImage clears what is still bound to the image (never a device number
	// reused meanwhile by another lease: it goes by the backing file).
	dev := ""
	if mounted {
		dev = m.Source
	}
	if err := detachImageFrom(img, dev); err != nil {
		return fmt.Errorf("disk: lease %s: %w", id, err)
	}
	if err := os.Remove(img); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("disk: lease %s: remove image: %w", id, err)
	}
	if mounted {
		q.log.DebugContext(ctx, "lease filesystem detached", "lease", id)
	}
	return nil
}

// Sweep detaches and deletes the images of leases owns does not know, including those
// whose directory is already gone, and returns their ids. Lease directories that are
// still mount points are the lease package's to detach (it calls Detach on orphans).
func (q *Quotas) Sweep(ctx context.Context, owns func(id string) bool) ([]string, error) {
	entries, err := os.ReadDir(q.cfg.ImageDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("disk: sweep: %w", err)
	}
	var swept []string
	var errs []error
	for _, de := range entries {
		if id, ok := strings.CutSuffix(de.Name(), ".img.new"); ok && idPattern.MatchString(id) && !owns(id) {
			_ = os.Remove(filepath.Join(q.cfg.ImageDir, de.Name())) // a format a crash cut short
			continue
		}
		id, ok := strings.CutSuffix(de.Name(), ".img")
		if !ok || !de.Type().IsRegular() || !idPattern.MatchString(id) || owns(id) {
			continue
		}
		if err := q.Detach(ctx, filepath.Join(q.cfg.WorkRoot, id)); err != nil {
			errs = append(errs, err)
			continue
		}
		q.log.InfoContext(ctx, "swept orphan lease filesystem", "lease", id)
		swept = append(swept, id)
	}
	return swept, errors.Join(errs...)
}

// Usage is the space the files in a lease's filesystem hold: the filesystem's used
// blocks, read with statfs. ext4 leaves its own metadata (journal, inode tables) out of
// that count, so an empty filesystem reads a few KiB (its root directory). ok is false
// when dir is not a filesystem of its own (mode off, or a lease without a quota): the
// caller then measures another way.
func (q *Quotas) Usage(dir string) (used int64, ok bool, err error) {
	var st, parent unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return 0, false, err
	}
	if err := unix.Lstat(filepath.Dir(dir), &parent); err != nil {
		return 0, false, err
	}
	if st.Dev == parent.Dev {
		return 0, false, nil
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		return 0, false, err
	}
	return int64(fs.Blocks-fs.Bfree) * fs.Bsize, true, nil
}
