package sandbox

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// A lease's helper starts in a copy of the daemon's mount namespace, which holds every
// lease's mounts (its disk, its devpts instance, its image root): with a copy per lease,
// the kernel would keep a number of mounts that grows with the square of the leases held
// (a million at 1,000 leases, ~380 MB of kernel memory), and every release would detach
// its mounts from every other lease's namespace. The directories that hold those mounts
// are made mount points here, once, so that a helper can detach each with one call
// (Config.DetachRoots, initproc.Config.Detach) and keep only its own lease's binds; and
// the C helper starts from a namespace without them at all (HelperMountNS), whose copy
// costs the same however many leases are held.

// HelperMountNS is a mount namespace for the C helper to copy instead of the daemon's
// (sandbox Config.HelperMountNS): the daemon's with the roots detached, so without any
// lease's mounts, now or later. Copying the daemon's own costs a mount per lease held, and
// its teardown as much again, at every helper's start; the helper puts its lease's bind
// sources back (initproc.Config.Trees). Its mounts are slaves of the daemon's: the host's
// later mounts and unmounts reach it where they reach the daemon's through propagation
// (systemd makes every mount shared); one made on a private mount does not, and leases
// started after it do not see it either. nil when a root could not be made a mount point:
// what is mounted under it later would be missing there. The namespace lives as long as
// the returned file.
func (r *MountRoots) HelperMountNS() (*os.File, error) {
	if r == nil || !r.complete || len(r.dirs) == 0 {
		return nil, nil
	}
	// The helper, root with the daemon's bounding set, needs it to enter the namespace.
	if ok, err := boundingSetHas(unix.CAP_SYS_CHROOT); err != nil || !ok {
		return nil, errors.Join(errors.New("entering it takes CAP_SYS_CHROOT, which is not in the daemon's capability bounding set (a systemd unit's CapabilityBoundingSet=)"), err)
	}
	return helperMountNS(r.dirs)
}

// errChrooted: the daemon's root is not its mount namespace's, which a helper entering
// the helpers' namespace would get instead.
var errChrooted = errors.New("the daemon runs chrooted: a helper entering the namespace would leave the chroot")

// boundingSetHas says whether capability c is in this process's bounding set.
func boundingSetHas(c int) (bool, error) {
	ok, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0)
	return ok == 1, err
}

func helperMountNS(roots []string) (*os.File, error) {
	type made struct {
		ns  *os.File
		err error
	}
	done := make(chan made, 1)
	// The caller's thread waits, locked, so that the goroutine below runs on another: the
	// runtime cannot end the main thread, and /proc/self names that one.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	go func() {
		// Never unlocked: the thread leaves the daemon's mount namespace and working
		// directory, so it must end with this goroutine rather than run anything else.
		runtime.LockOSThread()
		ns, err := func() (*os.File, error) {
			var root, nsRoot unix.Stat_t
			if err := unix.Stat("/", &root); err != nil {
				return nil, err
			}
			if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
				return nil, fmt.Errorf("unshare: %w", err)
			}
			ns, err := os.Open("/proc/thread-self/ns/mnt")
			if err != nil {
				return nil, err
			}
			// A helper entering the namespace gets its root, which is the daemon's unless
			// the daemon runs chrooted.
			err = unix.Setns(int(ns.Fd()), unix.CLONE_NEWNS)
			if err == nil {
				err = unix.Stat("/", &nsRoot)
			}
			if err == nil && (nsRoot.Dev != root.Dev || nsRoot.Ino != root.Ino) {
				err = errChrooted
			}
			if err == nil {
				if err = unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
					err = fmt.Errorf("make / a slave: %w", err)
				}
			}
			for _, r := range roots {
				if err == nil {
					if err = unix.Unmount(r, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil {
						err = fmt.Errorf("detach %s: %w", r, err)
					}
				}
			}
			if err != nil {
				ns.Close()
				return nil, err
			}
			return ns, nil
		}()
		done <- made{ns, err}
	}()
	m := <-done
	return m.ns, m.err
}

// MountRoots are the lease roots made mount points for the daemon's lifetime.
type MountRoots struct {
	dirs     []string // what helpers detach: every root that is a mount point
	complete bool     // every root asked for is in dirs
	ours     []string // bound by a sidecar (this run or an earlier one): unbound once empty
	marker   string
}

// BindMountRoots makes each of dirs (existing; symlinks resolved; one under another
// counts once) a mount point: a directory that already is one is used as it is (an
// operator's volume, a systemd ReadWritePaths= bind); any other is bound on itself and
// listed in the marker file, so that whichever run finds it empty at Close unbinds it. A
// directory that is no mount point but has mounts under it (leases left by a daemon that
// did not bind) is left alone, and its leases' helpers copy those mounts until a start
// finds it empty.
func BindMountRoots(dirs []string, marker string, log *slog.Logger) (*MountRoots, error) {
	r := &MountRoots{marker: marker, complete: true}
	listed, err := r.readMarker()
	if err != nil {
		return nil, err
	}
	// The mount table and the helpers' detach (which follows no symlink) name the real
	// directories.
	var resolved []string
	for _, d := range dirs {
		p, err := filepath.EvalSymlinks(d)
		if err != nil {
			return nil, fmt.Errorf("lease root: %w", err)
		}
		resolved = append(resolved, p)
	}
	for _, dir := range outermost(resolved) {
		mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
		if err != nil {
			return nil, fmt.Errorf("mount table: %w", err)
		}
		isRoot := slices.ContainsFunc(mounts, func(m *mountinfo.Info) bool { return m.Mountpoint == dir })
		switch {
		case isRoot:
			if slices.Contains(listed, dir) {
				r.ours = append(r.ours, dir)
			}
		case len(mounts) > 0:
			log.Warn("lease root has mounts under it but is no mount point: each lease's helpers keep a copy of them until the daemon starts with none there", "dir", dir)
			r.complete = false
			continue
		default:
			if err := bindPrivate(dir); err != nil {
				log.Warn("cannot make a lease root a mount point: each lease's helpers keep a copy of the mounts under it", "dir", dir, "err", err)
				r.complete = false
				continue
			}
			r.ours = append(r.ours, dir)
			if err := r.writeMarker(); err != nil {
				return nil, errors.Join(err, r.Close())
			}
		}
		r.dirs = append(r.dirs, dir)
	}
	return r, nil
}

// bindPrivate binds dir on itself, private: a bind of a shared mount (systemd makes every
// mount shared) would be its peer, and each lease mount under it would be copied under the
// source too, where no helper detaches it.
func bindPrivate(dir string) error {
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s on itself: %w", dir, err)
	}
	if err := unix.Mount("", dir, "", unix.MS_PRIVATE, ""); err != nil {
		return errors.Join(fmt.Errorf("make %s private: %w", dir, err), unix.Unmount(dir, unix.MNT_DETACH))
	}
	return nil
}

// Dirs are the roots a lease's helpers detach; none for a nil r.
func (r *MountRoots) Dirs() []string {
	if r == nil {
		return nil
	}
	return slices.Clone(r.dirs)
}

// Close unbinds each root a sidecar bound that has nothing mounted under it any more;
// one that still holds leases (they survive a restart) stays for the next run.
func (r *MountRoots) Close() error {
	var errs []error
	var kept []string
	for _, dir := range r.ours {
		mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
		if err != nil {
			return fmt.Errorf("mount table: %w", err)
		}
		if slices.ContainsFunc(mounts, func(m *mountinfo.Info) bool { return m.Mountpoint != dir }) {
			kept = append(kept, dir)
			continue
		}
		// Lazily: the daemon's own files there (its journal, locks) may still be open; the
		// directory shows the same files without the bind.
		if err := unix.Unmount(dir, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, fmt.Errorf("unbind %s: %w", dir, err))
			kept = append(kept, dir)
		}
	}
	r.ours, r.dirs = kept, nil
	return errors.Join(append(errs, r.writeMarker())...)
}

func (r *MountRoots) readMarker() ([]string, error) {
	b, err := os.ReadFile(r.marker)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("mount roots: %w", err)
	}
	return slices.DeleteFunc(strings.Split(string(b), "\n"), func(s string) bool { return s == "" }), nil
}

// writeMarker records the roots a sidecar bound, replacing the file whole; none: no file.
func (r *MountRoots) writeMarker() error {
	if len(r.ours) == 0 {
		if err := os.Remove(r.marker); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("mount roots: %w", err)
		}
		return nil
	}
	tmp := r.marker + ".tmp"
	if err := os.WriteFile(tmp, []byte(strings.Join(r.ours, "\n")+"\n"), 0o600); err != nil {
		return fmt.Errorf("mount roots: %w", err)
	}
	if err := os.Rename(tmp, r.marker); err != nil {
		return fmt.Errorf("mount roots: %w", err)
	}
	return nil
}

// outermost drops duplicates and each directory under another of dirs: detaching the
// outer one detaches it too.
func outermost(dirs []string) []string {
	var out []string
	for _, d := range dirs {
		d = filepath.Clean(d)
		if !slices.ContainsFunc(dirs, func(o string) bool {
			o = filepath.Clean(o)
			_, under := under(d, o)
			return o != d && under
		}) && !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	return out
}
