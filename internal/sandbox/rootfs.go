package sandbox

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// A lease with a LeaseRoot runs in an image instead of the host's root: the daemon mounts
// an overlay of the image's read-only layers under a writable layer of the lease's own, in
// <lease dir>/root (the parent of Workdir, so on the lease's own disk when disk quotas
// are on: what the lease writes outside /workspace counts against its disk_bytes), and
// each helper pivots into it after mounting the lease's /proc, /dev, /tmp, /workspace and
// user files there (initproc/root.go). The overlay is mounted in the daemon's mount
// namespace so that every command of the lease sees the same writable layer; another
// lease on the same layers has a writable layer of its own; both go at Teardown.
//
//	<lease dir>/root/upper   the lease's writable layer (root-owned 0755, like an image's /)
//	<lease dir>/root/work    overlayfs's work directory
//	<lease dir>/root/merged  the overlay, the lease's /

// LeaseRoot is the image a lease runs in.
type LeaseRoot struct {
	// Layers are the image's unpacked layer directories, top first (overlayfs lowerdir
	// order); read-only to every lease.
	Layers []string
	// Env is the image's environment (KEY=VALUE): applied over the lease's defaults
	// (PATH from the image), except the lease's identity (HOME, USER, LOGNAME, SHELL,
	// TMPDIR); the request's environment still comes last.
	Env []string
	// WorkingDir is the image's working directory. Lease commands still start in
	// /workspace (the lease contract): it is kept for the caller to show, not used here.
	WorkingDir string
	// AsRoot runs the lease's processes as root in a user namespace of the lease's own,
	// over id-mapped layers (userns.go); false: as the lease's uid.
	AsRoot bool
	// Owned mounts the layers id-mapped as for AsRoot, the image's root onto the lease's
	// uid, without the processes entering the namespace: they run as the lease's uid and
	// own what root owns in the image, so they change it in their writable layer as root
	// in a container would (pip install into the image's Python, npm install -g), with
	// no capability. Implied by AsRoot; needs what it needs (ProbeRootLeases).
	Owned bool
	// Stacks put read-only directories under the lease's own workdir and home, each as an
	// overlay whose lower is id-mapped onto the lease's uid as the layers are: the lease
	// starts with their content and nothing is copied (a lease started from a snapshot
	// stacks the snapshot's workspace and home). Needs an id-mapped root (Owned or AsRoot).
	Stacks []Stack
}

// A Stack is a read-only directory Lower under the lease's directory Dir (its Workdir or
// HomeDir). What the lease changes in Dir goes to an upper directory of the stack's
// beside its root's writable layer, on the lease's disk; a directory of Lower renamed is
// recorded there (redirect_dir), so renames work as in a plain directory.
type Stack struct{ Dir, Lower string }

// idMapped reports whether the root's layers are mounted id-mapped onto the lease's uid.
func (r *LeaseRoot) idMapped() bool { return r != nil && (r.AsRoot || r.Owned) }

// overlayFSName starts the source name of a lease's overlay in mountinfo, which Sweep finds
// the overlays of leases the daemon no longer knows by. The sandbox's cgroup parent
// follows, then ":" and the lease id: a parent has one daemon (owner.go), so a daemon
// sweeps its own leases' overlays and never another daemon's on the same host.
const overlayFSName = "sidecar-root-"

// rootSources is the source-name prefix of this sandbox's lease overlays (overlayFSName).
func rootSources(cgroupParent string) string { return overlayFSName + cgroupParent + ":" }

// maxOverlayOptions is the bound mount(2) puts on the option string (one page): a root
// whose layer paths do not fit is refused.
const maxOverlayOptions = 4095

// rootDirs are where lease l's overlay lives.
type rootDirs struct{ base, upper, work, merged string }

// stack are the upper and work directories of lease l's stack i.
func (d rootDirs) stack(i int) (upper, work string) {
	dir := filepath.Join(d.stacks(), strconv.Itoa(i))
	return filepath.Join(dir, "upper"), filepath.Join(dir, "work")
}

func (d rootDirs) stacks() string { return filepath.Join(d.base, "stacks") }

// StacksDir is where lease l's stacks keep what it changed (LeaseRoot.Stacks); there once
// one was mounted.
func StacksDir(l LeaseSpec) string { return leaseRootDirs(l).stacks() }

func leaseRootDirs(l LeaseSpec) rootDirs {
	base := filepath.Join(filepath.Dir(l.Workdir), "root")
	return rootDirs{base: base, upper: filepath.Join(base, "upper"), work: filepath.Join(base, "work"), merged: filepath.Join(base, "merged")}
}

// validateRoot checks a LeaseRoot's layers: absolute, clean, existing directories whose
// names overlayfs can take (no ':' or ',').
func validateRoot(l LeaseSpec) error {
	r := l.Root
	if r == nil {
		return nil
	}
	if len(r.Layers) == 0 {
		return fmt.Errorf("%w: lease %s root has no layers", ErrInvalid, l.ID)
	}
	if filepath.Dir(l.Workdir) == "/" || filepath.Dir(l.Workdir) != filepath.Dir(l.TmpDir) {
		return fmt.Errorf("%w: a lease with a root needs its workdir and tmp dir side by side in a lease directory", ErrInvalid)
	}
	for _, d := range r.Layers {
		if !filepath.IsAbs(d) || filepath.Clean(d) != d || strings.ContainsAny(d, ":,\x00") {
			return fmt.Errorf("%w: layer %q must be a clean absolute path without ':' or ','", ErrInvalid, d)
		}
		if st, err := os.Stat(d); err != nil || !st.IsDir() {
			return fmt.Errorf("%w: layer %q is not a directory", ErrInvalid, d)
		}
	}
	if len(overlayOptions(leaseRootDirs(l), r.Layers)) > maxOverlayOptions {
		return fmt.Errorf("%w: lease %s root: %d layers whose paths exceed the %d bytes of overlay options a mount takes", ErrInvalid, l.ID, len(r.Layers), maxOverlayOptions)
	}
	if len(r.Stacks) > 0 && !r.idMapped() {
		return fmt.Errorf("%w: lease %s stacks directories under its own, which needs its root id-mapped (Owned)", ErrInvalid, l.ID)
	}
	for i, st := range r.Stacks {
		if st.Dir != l.Workdir && (st.Dir != l.HomeDir || l.HomeDir == "") || slices.ContainsFunc(r.Stacks[:i], func(o Stack) bool { return o.Dir == st.Dir }) {
			return fmt.Errorf("%w: lease %s: a stack goes under its workdir or home, once each, not %q", ErrInvalid, l.ID, st.Dir)
		}
		if !filepath.IsAbs(st.Lower) || filepath.Clean(st.Lower) != st.Lower || strings.ContainsAny(st.Lower, ":,\x00") {
			return fmt.Errorf("%w: stack %q must be a clean absolute path without ':' or ','", ErrInvalid, st.Lower)
		}
		if fi, err := os.Stat(st.Lower); err != nil || !fi.IsDir() {
			return fmt.Errorf("%w: stack %q is not a directory", ErrInvalid, st.Lower)
		}
	}
	for _, e := range r.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" || strings.IndexByte(e, 0) >= 0 {
			return fmt.Errorf("%w: image environment entry %q", ErrInvalid, e)
		}
	}
	return nil
}

// overlayOptions mounts the layers under the writable one. redirect_dir and metacopy
// are off whatever the kernel's defaults: with either, an upper directory or file can
// stand for content of the layers below it, and the writable layer is then no longer a
// layer of its own (what a snapshot saves: lease/image/snapshot.go). A rename of an image
// directory gets EXDEV instead, which mv and package managers handle by copying.
func overlayOptions(d rootDirs, layers []string) string {
	return "lowerdir=" + strings.Join(layers, ":") + ",upperdir=" + d.upper + ",workdir=" + d.work + ",redirect_dir=off,metacopy=off"
}

// stackOptions mounts a stack: its lower under its upper, directory renames recorded
// (redirect_dir=on) so that they work as in a plain directory; nothing reads the upper
// but the overlay (a snapshot saves the merged directory).
func stackOptions(lower, upper, work string) string {
	return "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work + ",redirect_dir=on,metacopy=off"
}

// WritableLayer is the directory on the host that holds what lease l wrote into its
// image root (overlayfs' upper directory): whiteouts and opaque directories included, the
// lease's files owned by its uid.
func WritableLayer(l LeaseSpec) string { return leaseRootDirs(l).upper }

// mountRoot mounts lease l's overlay unless it is mounted already (Provision again, after a
// restart in the same mount namespace), makes the mount points the helper needs in it, and
// returns the merged directory ("" for a lease on the host's root). userns, for a lease
// that runs as root, id-maps its layers.
func mountRoot(l LeaseSpec, sources string, userns *os.File) (string, error) {
	if l.Root == nil {
		return "", nil
	}
	d := leaseRootDirs(l)
	for _, dir := range []string{d.base, d.upper, d.work, d.merged} {
		if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return "", fmt.Errorf("sandbox: lease %s root: %w", l.ID, err)
		}
	}
	// The upper's own attributes are the merged root's: an image's / is root's, 0755.
	if err := os.Chmod(d.upper, 0o755); err != nil {
		return "", fmt.Errorf("sandbox: lease %s root: %w", l.ID, err)
	}
	mounted, err := overlayAt(d.merged)
	if err != nil {
		return "", err
	}
	var stacks []int // those not mounted yet
	for i, st := range l.Root.Stacks {
		if on, err := overlayAt(st.Dir); err != nil {
			return "", err
		} else if !on {
			stacks = append(stacks, i)
		}
	}
	if !mounted || len(stacks) > 0 {
		if err := mountOverlay(l, d, sources, userns, !mounted, stacks); err != nil {
			return "", err
		}
	}
	if err := makeMountPoints(d.merged); err != nil {
		return "", fmt.Errorf("sandbox: lease %s root: %w", l.ID, err)
	}
	return d.merged, nil
}

// mountOverlay mounts lease l's overlay on d.merged (with root) and the stacks listed, on
// id-mapped layers when userns is given (whose root owns the writable layer's top then, as
// an image's root owns its /). Stacks are mounted under the same source name as the root,
// so that Sweep finds them too.
func mountOverlay(l LeaseSpec, d rootDirs, sources string, userns *os.File, root bool, stacks []int) error {
	layers := l.Root.Layers
	lowers := make([]string, len(stacks))
	for i, s := range stacks {
		lowers[i] = l.Root.Stacks[s].Lower
	}
	if userns != nil {
		if err := os.Lchown(d.upper, l.UID, l.GID); err != nil {
			return fmt.Errorf("sandbox: lease %s root: %w", l.ID, err)
		}
		mapped, err := mountIDMappedLayers(d, append(slices.Clone(layers), lowers...), userns)
		if err != nil {
			return errors.Join(fmt.Errorf("sandbox: lease %s root: %w", l.ID, err), unmountIDMappedLayers(d))
		}
		layers, lowers = mapped[:len(layers)], mapped[len(layers):]
	}
	var err error
	if root {
		if err = unix.Mount(sources+l.ID, d.merged, "overlay", unix.MS_NOSUID|unix.MS_NODEV, overlayOptions(d, layers)); err != nil {
			err = fmt.Errorf("sandbox: lease %s: mount its root overlay: %w", l.ID, err)
		}
	}
	for i, s := range stacks {
		if err != nil {
			break
		}
		err = mountStack(l, d, sources, s, lowers[i])
	}
	if userns != nil {
		err = errors.Join(err, unmountIDMappedLayers(d))
	}
	return err
}

// mountStack mounts lease l's stack i, lower being its (id-mapped) lower directory. The
// stack's upper takes the lease directory's owner and mode, which the merged directory
// shows.
func mountStack(l LeaseSpec, d rootDirs, sources string, i int, lower string) error {
	st := l.Root.Stacks[i]
	upper, work := d.stack(i)
	fi, err := os.Lstat(st.Dir)
	if err != nil {
		return fmt.Errorf("sandbox: lease %s: %w", l.ID, err)
	}
	sys := fi.Sys().(*syscall.Stat_t)
	for _, dir := range []string{filepath.Dir(filepath.Dir(upper)), filepath.Dir(upper), upper, work} {
		if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("sandbox: lease %s stack: %w", l.ID, err)
		}
	}
	if err := os.Lchown(upper, int(sys.Uid), int(sys.Gid)); err != nil {
		return fmt.Errorf("sandbox: lease %s stack: %w", l.ID, err)
	}
	if err := os.Chmod(upper, fi.Mode().Perm()); err != nil {
		return fmt.Errorf("sandbox: lease %s stack: %w", l.ID, err)
	}
	if err := unix.Mount(sources+l.ID, st.Dir, "overlay", unix.MS_NOSUID|unix.MS_NODEV, stackOptions(lower, upper, work)); err != nil {
		return fmt.Errorf("sandbox: lease %s: stack %s under %s: %w", l.ID, st.Lower, st.Dir, err)
	}
	return nil
}

// rootMountPoints are what the helper mounts over in a lease's root: directories, then
// files (an image without them gets them in the lease's writable layer).
var (
	rootMountDirs  = []string{"proc", "dev", "tmp", "etc", strings.TrimPrefix(HomeMount, "/"), strings.TrimPrefix(Workspace, "/")}
	rootMountFiles = []string{"etc/passwd", "etc/group", "etc/resolv.conf"}
)

// makeMountPoints makes each mount point the image lacks, replacing a symlink or another
// non-directory where one is needed (the helper never mounts through a symlink): a
// directory root-owned 0755, a file root-owned 0644. The change is in the lease's writable
// layer only.
func makeMountPoints(merged string) error {
	root, err := os.OpenRoot(merged)
	if err != nil {
		return err
	}
	defer root.Close()
	for _, p := range rootMountDirs {
		if err := mountPoint(root, p, true); err != nil {
			return err
		}
	}
	for _, p := range rootMountFiles {
		if err := mountPoint(root, p, false); err != nil {
			return err
		}
	}
	return nil
}

func mountPoint(root *os.Root, p string, dir bool) error {
	st, err := root.Lstat(p)
	switch {
	case err == nil && st.IsDir() == dir && (dir || st.Mode().IsRegular()):
		return nil
	case err == nil && st.IsDir():
		return fmt.Errorf("/%s in the image is a directory, not a file", p)
	case err == nil:
		if err := root.Remove(p); err != nil {
			return err
		}
	case !errors.Is(err, fs.ErrNotExist):
		return err
	}
	if dir {
		return root.Mkdir(p, 0o755)
	}
	f, err := root.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}

// unmountRoot unmounts lease l's overlay and its id-mapped layers. Its directories (the
// writable layer with them) are left to whoever removes the lease's directory, where they
// are: with a disk quota the lease's whole filesystem goes at once, where removing the
// writable layer file by file first cost more than the rest of a lease's release.
func unmountRoot(l LeaseSpec) error {
	if l.Root == nil {
		return nil
	}
	d := leaseRootDirs(l)
	if err := unmountOverlay(d.merged); err != nil {
		return err
	}
	for _, st := range l.Root.Stacks {
		if err := unmountOverlay(st.Dir); err != nil {
			return err
		}
	}
	if err := unmountIDMappedLayers(d); err != nil {
		return fmt.Errorf("sandbox: lease %s root: %w", l.ID, err)
	}
	return nil
}

// unmountOverlay unmounts what is mounted on dir, stacked mounts too (lazily: the
// lease's processes are gone, but a daemon descriptor, a file transfer say, may still
// hold it). Only the lease's overlay is ever mounted there.
func unmountOverlay(dir string) error {
	for {
		err := unix.Unmount(dir, unix.MNT_DETACH)
		switch {
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil // not (or no longer) a mount point
		case err != nil:
			return fmt.Errorf("sandbox: unmount %s: %w", dir, err)
		}
	}
}

// overlayAt reports whether an overlay is mounted on dir: dir is on another filesystem
// than its parent, and that filesystem is an overlay. Two stats, where reading mountinfo
// costs a millisecond on a host with many mounts.
func overlayAt(dir string) (bool, error) {
	var st, parent unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return false, fmt.Errorf("sandbox: %s: %w", dir, err)
	}
	if err := unix.Lstat(filepath.Dir(dir), &parent); err != nil {
		return false, fmt.Errorf("sandbox: %s: %w", dir, err)
	}
	if st.Dev == parent.Dev {
		return false, nil
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		return false, fmt.Errorf("sandbox: %s: %w", dir, err)
	}
	return fs.Type == unix.OVERLAYFS_SUPER_MAGIC, nil
}

// sweepRoots unmounts the overlays of leases known says are gone (a crash between mount
// and release), found by their source name (sources and the lease id), and returns their
// lease ids. Their directories are left to whoever removes the lease's directory.
func sweepRoots(sources string, known func(id string) bool) ([]string, error) {
	ms, err := mountinfo.GetMounts(func(m *mountinfo.Info) (skip, stop bool) {
		id, ok := strings.CutPrefix(m.Source, sources)
		return !(ok && m.FSType == "overlay" && leaseIDPattern.MatchString(id) && !known(id)), false
	})
	if err != nil {
		return nil, err
	}
	var ids []string
	var errs []error
	for _, m := range ms {
		if err := unmountOverlay(m.Mountpoint); err != nil {
			errs = append(errs, err)
			continue
		}
		if id := strings.TrimPrefix(m.Source, sources); !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	return ids, errors.Join(errs...)
}

// rootWritable are the top-level directories of a lease's root that its processes may
// write to where file modes let them (Landlock's read-write rule; the writable layer is
// the lease's own): all but /proc, /dev and /sys, which the helper mounts or leaves out,
// and /tmp and Workspace, which have their rules whatever the root.
func rootWritable(merged string) ([]string, error) {
	entries, err := os.ReadDir(merged)
	if err != nil {
		return nil, err
	}
	var dirs []string
	for _, e := range entries {
		switch e.Name() {
		case "proc", "dev", "sys", "tmp", strings.TrimPrefix(Workspace, "/"): // ruled apart
			continue
		}
		if e.IsDir() {
			dirs = append(dirs, "/"+e.Name())
		}
	}
	return dirs, nil
}

// provisionRoot mounts lease l's root, if it has one, and lists what Landlock lets it
// write there.
func (s *Sandbox) provisionRoot(l LeaseSpec, userns *os.File) (merged string, writable []string, err error) {
	if merged, err = mountRoot(l, s.rootSources, userns); err != nil || merged == "" {
		return "", nil, err
	}
	if writable, err = rootWritable(merged); err != nil {
		return "", nil, fmt.Errorf("sandbox: lease %s root: %w", l.ID, err)
	}
	return merged, writable, nil
}
