package initproc

import (
	"fmt"
	"strconv"

	"golang.org/x/sys/unix"
)

// A lease with a root of its own (Config.Root, an overlay the daemon mounted) gets every
// mount of setup inside that root, then the helper pivots into it, so the host's root is
// gone from the process's view. The root's writable layer is the lease's: a lease process
// may have replaced a mount point there with a symlink, so every mount target inside it is
// opened first without following any symlink and beneath the root (openat2), and the
// mount goes on that descriptor (/proc/self/fd/N), never on a path looked up again.
//
// /dev is a small tmpfs of the helper's own holding binds of the few devices a lease uses
// (rootDevices), the lease's PTYs and the /proc/self/fd links, then made read-only: a
// recursive bind of the host's /dev would show every disk, loop and kmsg node of the host
// (guarded only by their modes) and whatever the host adds there later.

// rootDevices are the host devices bound into a lease root's /dev.
var rootDevices = []string{"null", "zero", "full", "random", "urandom", "tty"}

// rootDevLinks are the symlinks of a lease root's /dev.
var rootDevLinks = [][2]string{{"fd", "/proc/self/fd"}, {"stdin", "/proc/self/fd/0"}, {"stdout", "/proc/self/fd/1"}, {"stderr", "/proc/self/fd/2"}}

// devOptions is the lease root's /dev tmpfs: room for the entries above and no more.
const devOptions = "mode=0755,size=16k,nr_inodes=64"

// inRoot opens p (absolute, as the lease names it) beneath cfg.Root without following a
// symlink, and returns the name a mount takes it by and the descriptor to close after;
// without a root, p itself.
func inRoot(cfg *Config, p string) (target string, fd int, err error) {
	if cfg.Root == "" {
		return p, -1, nil
	}
	root, err := unix.Open(cfg.Root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", -1, fmt.Errorf("open root %s: %w", cfg.Root, err)
	}
	defer unix.Close(root)
	how := unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS}
	fd, err = unix.Openat2(root, "."+p, &how)
	if err != nil {
		return "", -1, err // the caller names the mount, as the C helper's strerror does
	}
	return "/proc/self/fd/" + strconv.Itoa(fd), fd, nil
}

// mountIn mounts on p (as the lease names it) inside the root, or on p without one.
func mountIn(cfg *Config, src, p, fstype string, flags uintptr, data string) error {
	target, fd, err := inRoot(cfg, p)
	if err != nil {
		return err
	}
	if fd >= 0 {
		defer unix.Close(fd)
	}
	return unix.Mount(src, target, fstype, flags, data)
}

// bindRoot makes the root a mount of the helper's namespace of its own (pivot_root needs
// one), bringing the mounts under it along.
func bindRoot(cfg *Config) error {
	if err := inPrivateNS(cfg, cfg.Root); err != nil {
		return err
	}
	if err := unix.Mount(cfg.Root, cfg.Root, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s on itself: %w", cfg.Root, err)
	}
	return nil
}

// privateDev mounts the root's /dev: a tmpfs with rootDevices bound from the host's,
// rootDevLinks, and mount points for the PTYs (privatePTS binds them; rootDevReadOnly
// seals it after).
func privateDev(cfg *Config) error {
	flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
	if err := mountIn(cfg, "tmpfs", "/dev", "tmpfs", flags, devOptions); err != nil {
		return fmt.Errorf("mount /dev: %w", err)
	}
	_, dev, err := inRoot(cfg, "/dev")
	if err != nil {
		return fmt.Errorf("open /dev in the lease root: %w", err)
	}
	defer unix.Close(dev)
	for _, name := range append(rootDevices, "ptmx") {
		if err := bindDevice(dev, name); err != nil {
			return err
		}
	}
	for _, l := range rootDevLinks {
		if err := unix.Symlinkat(l[1], dev, l[0]); err != nil {
			return fmt.Errorf("/dev/%s: %w", l[0], err)
		}
	}
	if err := unix.Mkdirat(dev, "pts", 0o755); err != nil {
		return fmt.Errorf("/dev/pts: %w", err)
	}
	return nil
}

// bindDevice makes /dev/name in the dev directory and binds the host's on it; ptmx only
// gets its mount point, for privatePTS.
func bindDevice(dev int, name string) error {
	fd, err := unix.Openat(dev, name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o666)
	if err != nil {
		return fmt.Errorf("/dev/%s: %w", name, err)
	}
	defer unix.Close(fd)
	if name == "ptmx" {
		return nil
	}
	if err := unix.Mount("/dev/"+name, "/proc/self/fd/"+strconv.Itoa(fd), "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind /dev/%s: %w", name, err)
	}
	return nil
}

// rootDevReadOnly makes the root's /dev tmpfs read-only once everything is in it (the
// binds in it keep their own flags).
func rootDevReadOnly(cfg *Config) error {
	flags := uintptr(unix.MS_REMOUNT | unix.MS_BIND | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
	if err := mountIn(cfg, "", "/dev", "", flags, ""); err != nil {
		return fmt.Errorf("remount /dev read-only: %w", err)
	}
	return nil
}

// enterRoot pivots into the root and detaches the host's, which no lease process can
// reach again.
func enterRoot(cfg *Config) error {
	if err := unix.Chdir(cfg.Root); err != nil {
		return fmt.Errorf("chdir %s: %w", cfg.Root, err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root %s: %w", cfg.Root, err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the host's root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("chdir /: %w", err)
	}
	return nil
}
