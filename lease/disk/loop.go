package disk

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// mkfsArgs format an image: 4 KiB blocks and one inode per 16 KiB (a 64 MiB image keeps
// 90% of its size for files, 4096 inodes), no blocks reserved for root (nothing of root
// runs there), no room kept for online growth (images never grow), and nothing written
// that the kernel can initialise lazily, so a sparse image costs the host ~150 KiB at
// first and mkfs takes ~20 ms whatever the size (measured: 64 MiB and 10 GiB alike).
// Templates (template.go) add features to these.
func mkfsArgs(features, extended string) []string {
	return []string{"-q", "-F", "-t", "ext4", "-b", "4096", "-T", "default", "-m", "0",
		"-O", "^resize_inode" + features, "-E", "nodiscard,lazy_itable_init=1,lazy_journal_init=1" + extended}
}

// mountFlags: nothing set-uid or device-like works from a lease's files. mountData (one
// flag, as mountDetached sets it): space freed in the lease's filesystem is punched out of
// the image, so the host's cost follows what the lease holds now, not the most it ever held.
const (
	mountFlags = unix.MS_NOSUID | unix.MS_NODEV
	mountData  = "discard"
)

// findMkfs looks in PATH and then the sbin directories a daemon's PATH may lack.
func findMkfs() (string, error) {
	if p, err := exec.LookPath("mkfs.ext4"); err == nil {
		return p, nil
	}
	for _, d := range []string{"/usr/sbin", "/sbin"} {
		p := filepath.Join(d, "mkfs.ext4")
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", errors.New("mkfs.ext4 not found (install e2fsprogs)")
}

// makeImage makes a sparse image of size bytes and formats it with mkfs and args (nil:
// mkfsArgs as they are). It writes under a temporary name and renames, so img is either
// absent or whole.
func makeImage(ctx context.Context, mkfs, img string, bytes int64, args []string) error {
	tmp := img + ".new"
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("disk: make image: %w", err)
	}
	err = f.Truncate(bytes)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		if args == nil {
			args = mkfsArgs("", "")
		}
		if out, merr := exec.CommandContext(ctx, mkfs, append(args, tmp)...).CombinedOutput(); merr != nil {
			err = fmt.Errorf("mkfs.ext4: %v: %s", merr, strings.TrimSpace(string(out)))
		}
	}
	if err == nil {
		err = os.Rename(tmp, img)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("disk: make image %s: %w", filepath.Base(img), err)
	}
	return nil
}

// mountImage mounts img on dir. When a loop device is still bound to img, its filesystem
// is alive somewhere (a lazy unmount's lingering user; under systemd's PrivateMounts=,
// the mount namespace of the previous run, going away): it is mounted through that same
// device, never a second one, since two devices would be two ext4 instances writing one
// image. Otherwise img is attached to a free device with autoclear, so the device detaches
// by itself when the filesystem is unmounted and its last user gone: no loop device
// outlives its mount, even after a lazy unmount.
func mountImage(img, dir string, fresh bool) error {
	for range 3 {
		if fresh {
			break // made by this process and never attached: no device can be bound to it
		}
		devs, err := loopsOf(img)
		if err != nil {
			return err
		}
		if len(devs) == 0 {
			break
		}
		if err := unix.Mount(devs[0], dir, "ext4", mountFlags, mountData); err == nil {
			return nil
		} else if still, _ := loopsOf(img); len(still) > 0 {
			return fmt.Errorf("mount %s (already bound to the image) on %s: %w", devs[0], dir, err)
		}
		// The device let go of the image meanwhile: look again.
	}
	dev, loop, err := attachLoop(img)
	if err != nil {
		return err
	}
	// Closing the device before it is mounted would clear it (autoclear).
	defer loop.Close()
	if err := unix.Mount(dev, dir, "ext4", mountFlags, mountData); err != nil {
		return fmt.Errorf("mount %s on %s: %w", dev, dir, err)
	}
	return nil
}

// mountDetached mounts img, formatted by this process and never attached, as a mount that
// belongs to no mount namespace yet (fsopen, fsmount): the pool keeps it, and Attach moves
// it onto a lease's directory (moveMount) instead of attaching a device and mounting while
// the acquire waits. Until then it is in no mount table, so no namespace copies it. The
// lost+found that mkfs makes goes first: it would count as the lease's usage.
func mountDetached(img string) (*os.File, error) {
	dev, loop, err := attachLoop(img)
	if err != nil {
		return nil, err
	}
	defer loop.Close() // after the filesystem holds the device: closing it sooner clears it
	fsfd, err := unix.Fsopen("ext4", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("fsopen ext4: %w", err)
	}
	defer unix.Close(fsfd)
	if err := unix.FsconfigSetString(fsfd, "source", dev); err != nil {
		return nil, fmt.Errorf("fsconfig source %s: %w", dev, err)
	}
	if err := unix.FsconfigSetFlag(fsfd, mountData); err != nil {
		return nil, fmt.Errorf("fsconfig %s: %w", mountData, err)
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return nil, fmt.Errorf("fsconfig create on %s: %w", dev, err)
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return nil, fmt.Errorf("fsmount %s: %w", dev, err)
	}
	mnt := os.NewFile(uintptr(mfd), img)
	if err := unix.Unlinkat(mfd, "lost+found", unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		mnt.Close()
		return nil, fmt.Errorf("remove lost+found: %w", err)
	}
	return mnt, nil
}

// moveMount puts a detached mount (mountDetached) on dir.
func moveMount(mnt *os.File, dir string) error {
	return unix.MoveMount(int(mnt.Fd()), "", unix.AT_FDCWD, dir, unix.MOVE_MOUNT_F_EMPTY_PATH)
}

// attachLoop binds img to a free loop device (LOOP_CTL_GET_FREE, then LOOP_CONFIGURE in
// one call). A device taken by someone else between the two is skipped.
func attachLoop(img string) (string, *os.File, error) {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, fmt.Errorf("loop control: %w", err)
	}
	defer ctl.Close()
	f, err := os.OpenFile(img, os.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, fmt.Errorf("open image: %w", err)
	}
	defer f.Close()
	for range 32 {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", nil, fmt.Errorf("get a free loop device: %w", err)
		}
		dev := fmt.Sprintf("/dev/loop%d", n)
		loop, err := openLoop(dev, n)
		if err != nil {
			return "", nil, err
		}
		cfg := unix.LoopConfig{Fd: uint32(f.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], img)
		err = unix.IoctlLoopConfigure(int(loop.Fd()), &cfg)
		if err == nil {
			return dev, loop, nil
		}
		loop.Close()
		if !errors.Is(err, unix.EBUSY) {
			return "", nil, fmt.Errorf("configure %s: %w", dev, err)
		}
	}
	return "", nil, errors.New("no free loop device after 32 tries")
}

// openLoop opens /dev/loopN, making the node when the host's /dev lacks it (a static /dev
// in a container only has the first few).
func openLoop(dev string, n int) (*os.File, error) {
	f, err := os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0)
	if errors.Is(err, os.ErrNotExist) {
		if err := unix.Mknod(dev, unix.S_IFBLK|0o660, int(unix.Mkdev(7, uint32(n)))); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("make %s: %w", dev, err)
		}
		f, err = os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", dev, err)
	}
	return f, nil
}

// unmount unmounts dir, lazily when the filesystem is busy: the caller killed the lease's
// processes first, so what still holds it is transient (a daemon read in flight) or a
// copy of the mount in another mount namespace, and the lazy unmount lets it go with them.
func unmount(dir string) error {
	err := unix.Unmount(dir, unix.UMOUNT_NOFOLLOW)
	if errors.Is(err, unix.EBUSY) {
		err = unix.Unmount(dir, unix.UMOUNT_NOFOLLOW|unix.MNT_DETACH)
	}
	if err != nil && !errors.Is(err, unix.EINVAL) { // EINVAL: not a mount point (any more)
		return fmt.Errorf("unmount %s: %w", dir, err)
	}
	return nil
}

// clearLoop detaches a loop device; on a busy one the kernel sets autoclear instead.
func clearLoop(dev string) error {
	f, err := os.OpenFile(dev, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	err = unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0)
	if errors.Is(err, unix.ENXIO) { // not bound
		return nil
	}
	return err
}

// loopBacking reads the file a loop device is bound to ("" when unbound).
func loopBacking(dev string) (string, error) {
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop", "backing_file"))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)"), nil
}

// loopsOf lists the loop devices bound to img.
func loopsOf(img string) ([]string, error) {
	devs, err := filepath.Glob("/sys/block/loop*")
	if err != nil {
		return nil, err
	}
	var found []string
	for _, d := range devs {
		dev := "/dev/" + filepath.Base(d)
		if b, err := loopBacking(dev); err == nil && b == img {
			found = append(found, dev)
		}
	}
	return found, nil
}

// detachImage clears every loop device still bound to img. One the kernel cannot clear
// yet is set to autoclear (it was attached with autoclear anyway) and is not an error:
// deleting the image then frees its space when the device lets go. What holds it is a
// lazy unmount's lingering user, or a copy of the mount in the mount namespace of
// another lease's process started while this lease was mounted; the kernel drops those
// copies when the lease package removes the (then unmounted) directory, since a mount
// point removed in one namespace is unmounted in all others
// (TestDiskQuotaReleaseWhileAnotherLeaseRuns). So nothing here waits for the device:
// the copies cannot go before Detach returns, and a wait for them would only delay every
// release beside a launcher made meanwhile (by the whole wait: they never go sooner).
func detachImage(img string) error { return detachImageFrom(img, "") }

// detachImageFrom is detachImage knowing the device img was mounted from ("": unknown,
// every loop device is looked at).
func detachImageFrom(img, dev string) error {
	var devs []string
	var err error
	if dev == "" {
		devs, err = loopsOf(img) // reads every loop device the host has: as many as leases ever held at once
	} else if b, _ := loopBacking(dev); b == img {
		devs = []string{dev}
	}
	for _, dev := range devs {
		_ = clearLoop(dev)
	}
	return err
}

// mountAt returns what is mounted on dir: the topmost mount when several are stacked there,
// as seen from the calling thread's mount namespace, the one mount and umount act in.
//
// statx says whether dir is a mount root and which device its filesystem is on, whatever
// the number of mounts (one per lease): a loop device is named by its number in sysfs,
// and any other device only needs naming in an error, since only a lease's own loop
// device is ever adopted or unmounted. Kernels before 5.8 give no mount-root attribute:
// there the calling thread's mountinfo is read (/proc/thread-self: /proc/self is the main
// thread's, where a goroutine that unshared its namespace and exited locked can leave it).
func mountAt(dir string) (*mountinfo.Info, bool, error) {
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, dir, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BASIC_STATS, &stx); err != nil {
		return nil, false, fmt.Errorf("disk: %w", err)
	}
	if stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT == 0 {
		return mountAtFromMountinfo(dir)
	}
	if stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT == 0 {
		return nil, false, nil
	}
	return &mountinfo.Info{Mountpoint: dir, Source: deviceName(stx.Dev_major, stx.Dev_minor)}, true, nil
}

// deviceName is /dev/<name> for a block device (a loop device is /dev/loopN), else the
// device number (tmpfs and other filesystems without a device).
func deviceName(major, minor uint32) string {
	if link, err := os.Readlink(fmt.Sprintf("/sys/dev/block/%d:%d", major, minor)); err == nil {
		return "/dev/" + filepath.Base(link)
	}
	return fmt.Sprintf("device %d:%d", major, minor)
}

// mountAtFromMountinfo is mountAt for kernels without STATX_ATTR_MOUNT_ROOT: later lines
// of mountinfo are mounted on top.
func mountAtFromMountinfo(dir string) (*mountinfo.Info, bool, error) {
	ms, err := mountinfo.GetMounts(func(m *mountinfo.Info) (skip, stop bool) { return m.Mountpoint != dir, false })
	if err != nil {
		return nil, false, fmt.Errorf("disk: %w", err)
	}
	if len(ms) == 0 {
		return nil, false, nil
	}
	return ms[len(ms)-1], true, nil
}

// probeLoop makes, mounts and removes a filesystem of the default size in the image dir:
// what every lease will need, tried once at startup (and the pool's template made).
func (q *Quotas) probeLoop(ctx context.Context) error {
	if os.Geteuid() != 0 {
		return errors.New("loop devices and mounts need root")
	}
	mkfs, err := findMkfs()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(q.cfg.ImageDir, 0o700); err != nil {
		return fmt.Errorf("image dir: %w", err)
	}
	if err := os.Chmod(q.cfg.ImageDir, 0o700); err != nil {
		return fmt.Errorf("image dir: %w", err)
	}
	probe := filepath.Join(q.cfg.ImageDir, "probe")
	img, point := probe+".img", probe+".mnt"
	// A probe left by a crash: undo it first.
	_ = unmount(point)
	_ = detachImage(img)
	_ = os.Remove(img)
	if err := os.Mkdir(point, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("probe: %w", err)
	}
	defer os.Remove(point)
	q.tpl = newTemplates(mkfs, filepath.Join(q.cfg.ImageDir, "templates"), q.log)
	if err := q.tpl.format(ctx, img, max(q.cfg.DefaultBytes, MinBytes)); err != nil {
		return err
	}
	defer os.Remove(img)
	if err := mountImage(img, point, true); err != nil { // just made
		return err
	}
	if err := unmount(point); err != nil {
		return err
	}
	return detachImage(img)
}
