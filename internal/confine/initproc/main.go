package initproc

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sidecar-sandbox/sidecar/internal/kernel/seccomp"
)

// Main is the helper's entry point; it never returns. Every step runs on one locked OS
// thread, and credentials, no_new_privs, Landlock and the network namespace are changed for
// that thread only: execve from it keeps just that thread, so the target gets all of them,
// while the helper's other runtime threads die with the exec.
func Main() {
	runtime.LockOSThread()
	cfg, err := readConfig()
	if err != nil {
		fail(ExitSetup, "config", err)
	}
	if cfg.Fork {
		fail(ExitSetup, "setup", ErrForkNeedsC)
	}
	if cfg.MountNS {
		fail(ExitSetup, "setup", ErrMountNSNeedsC)
	}
	if err := setup(cfg); err != nil {
		fail(ExitSetup, "setup", err)
	}
	if cfg.Await {
		if err := awaitLaunch(cfg); err != nil {
			fail(ExitSetup, "setup", err)
		}
	}
	code, err := execTarget(cfg)
	fail(code, "exec", err)
}

// readConfig reads the sealed memfd on ConfigFD; a descriptor that is not one (or could
// still change) is refused.
func readConfig() (*Config, error) {
	b, err := readSealed(ConfigFD)
	if err != nil {
		return nil, err
	}
	return Decode(b)
}

// setup runs in the order that keeps each step possible: cgroups, namespaces, mounts (the
// workdir's last, so that no source path is ever looked up through /workspace) and
// resource limits need root; the uid drop comes next, then no_new_privs (which Landlock
// and seccomp require), Landlock, the working directory, entered as the lease's uid under
// the policy, and the seccomp filter last.
func setup(cfg *Config) error {
	pid := strconv.Itoa(os.Getpid())
	for _, procs := range cfg.CgroupProcs {
		if err := os.WriteFile(procs, []byte(pid), 0); err != nil {
			return fmt.Errorf("join cgroup: %w", err)
		}
	}
	if cfg.NetNS {
		if err := unix.Setns(NetNSFD, unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("join network namespace: %w", err)
		}
	}
	if err := privateMounts(cfg); err != nil {
		return err
	}
	// The daemon protects itself from the OOM killer (OOMScoreAdjust=-900 in its unit);
	// lease processes must not inherit that: under host memory pressure they go first.
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte(LeaseOOMScoreAdj), 0); err != nil {
		return fmt.Errorf("oom_score_adj: %w", err)
	}
	// Nor the daemon's umask (UMask=0077 in its unit): lease processes start with the
	// usual one, whoever started the daemon.
	unix.Umask(LeaseUmask)
	if err := setRlimits(cfg.Rlimits); err != nil {
		return err
	}
	if cfg.UserNS {
		return ErrUserNSNeedsC
	}
	if cfg.UID != 0 {
		if err := dropPrivileges(cfg.UID, cfg.GID); err != nil {
			return err
		}
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	if cfg.Landlock != nil {
		if err := restrict(cfg.Landlock); err != nil {
			return err
		}
	}
	if cfg.Dir != "" {
		if err := unix.Chdir(cfg.Dir); err != nil {
			return fmt.Errorf("chdir %s: %w", cfg.Dir, err)
		}
	}
	// Everything above 2 (config, namespace fd, runtime descriptors) closes at exec; the
	// report pipe stays open until then so that an exec failure can still be told.
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return fmt.Errorf("close_range: %w", err)
	}
	// Last: the filter needs no_new_privs, and nothing above may need a denied call.
	if cfg.Seccomp != nil {
		if err := seccomp.Load(cfg.Seccomp); err != nil {
			return err
		}
	}
	return nil
}

// privateMounts makes the process's view in its private mount namespace: /tmp, /proc,
// the lease's root and /dev (root.go), PTYs, user files, and the workdir last, so that no
// source path is ever looked up through /workspace; then it enters the root.
func privateMounts(cfg *Config) error {
	if cfg.TmpDir != "" {
		if err := privateTmp(cfg); err != nil {
			return err
		}
		if cfg.UID != 0 || cfg.Root != "" {
			if err := privateProc(cfg); err != nil {
				return err
			}
			if err := privateCgroups(cfg); err != nil {
				return err
			}
		}
	} else if cfg.Root != "" {
		return inPrivateNS(cfg, cfg.Root) // refuses: a root needs the private namespace
	}
	if cfg.Root != "" {
		if err := privateDev(cfg); err != nil {
			return err
		}
	}
	if cfg.PTSDir != "" || cfg.Root != "" {
		if err := privatePTS(cfg); err != nil {
			return err
		}
	}
	if cfg.Root != "" {
		if err := rootDevReadOnly(cfg); err != nil {
			return err
		}
	}
	for _, b := range []struct{ src, dst string }{{cfg.Passwd, "/etc/passwd"}, {cfg.Group, "/etc/group"}, {cfg.Resolv, "/etc/resolv.conf"}} {
		if b.src != "" {
			if err := bindPrivate(cfg, b.src, b.dst); err != nil {
				return err
			}
		}
	}
	if cfg.Home != "" {
		if err := privateBind(cfg, cfg.Home, HomeMount); err != nil {
			return err
		}
	}
	if cfg.WorkDir != "" {
		if err := privateBind(cfg, cfg.WorkDir, Workspace); err != nil {
			return err
		}
	}
	if cfg.Root != "" {
		return enterRoot(cfg)
	}
	return detachLeaseMounts(cfg)
}

// detachLeaseMounts detaches Config.Detach from the private mount namespace, last, since
// every bind above has its source there.
func detachLeaseMounts(cfg *Config) error {
	if len(cfg.Detach) == 0 {
		return nil
	}
	if err := inPrivateNS(cfg, cfg.Detach[0]); err != nil {
		return err
	}
	for _, d := range cfg.Detach {
		if err := unix.Unmount(d, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil {
			return fmt.Errorf("detach %s: %w", d, err)
		}
	}
	return nil
}

// ErrForkNeedsC refuses Config.Fork: a zygote forks and goes on running, which a Go
// program cannot do.
var ErrForkNeedsC = errors.New("a zygote needs the C helper (sidecar-init built from sidecar-init.c): a Go program cannot fork and go on running")

// ErrMountNSNeedsC refuses Config.MountNS: setns(CLONE_NEWNS) takes a process whose
// filesystem attributes no other thread shares, and a Go program's threads share them.
var ErrMountNSNeedsC = errors.New("entering a prepared mount namespace needs the C helper (sidecar-init built from sidecar-init.c): a Go helper's threads share their filesystem attributes")

// ErrUserNSNeedsC refuses Config.UserNS: the kernel lets only a single-threaded process
// into a user namespace, and a Go program always has several threads.
var ErrUserNSNeedsC = errors.New("root in a user namespace needs the C helper (sidecar-init built from sidecar-init.c): setns(CLONE_NEWUSER) takes a single-threaded process, and a Go helper has several threads")

// setRlimits sets each limit, soft and hard; rlimits are per process, so the target
// inherits them across the exec.
func setRlimits(limits []Rlimit) error {
	for _, r := range limits {
		v := uint64(r.Value)
		if err := unix.Setrlimit(RlimitResources[r.Name], &unix.Rlimit{Cur: v, Max: v}); err != nil {
			return fmt.Errorf("rlimit_%s: %w", r.Name, err)
		}
	}
	return nil
}

// privateTmp bind-mounts the lease's TmpDir on /tmp. The daemon started the helper in a new
// mount namespace; checking that here means a caller that dropped the clone flags gets an
// error instead of a mount in the host's namespace.
func privateTmp(cfg *Config) error {
	ns, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return fmt.Errorf("mount namespace: %w", err)
	}
	if cfg.HostMountNS == "" || ns == cfg.HostMountNS {
		return errors.New("refusing to mount /tmp: not in a private mount namespace")
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	if cfg.Root != "" {
		if err := bindRoot(cfg); err != nil {
			return err
		}
	}
	if err := mountIn(cfg, cfg.TmpDir, "/tmp", "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s on /tmp: %w", cfg.TmpDir, err)
	}
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_NOSUID | unix.MS_NODEV)
	if err := mountIn(cfg, "", "/tmp", "", flags, ""); err != nil {
		return fmt.Errorf("remount /tmp nosuid,nodev: %w", err)
	}
	return nil
}

// privateProc mounts a procfs of the lease's own over /proc with hidepid=invisible: a
// lease sees only its own uid's processes, so it cannot read another lease's (or the
// daemon's) command lines, environment or open files, nor learn they exist.
func privateProc(cfg *Config) error {
	flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
	if err := mountIn(cfg, "proc", "/proc", "proc", flags, "hidepid=invisible"); err != nil {
		return fmt.Errorf("mount private /proc: %w", err)
	}
	return nil
}

// privateCgroups hides the host's cgroup tree, which names every daemon's parent, every
// lease, their host pids and memory use: a cgroup namespace rooted at the cgroup the helper
// joined (so /proc/self/cgroup shows "/"), and on a host root an empty read-only tmpfs over
// /sys/fs/cgroup (an image root mounts no /sys). The lease's limits bind it all the same.
func privateCgroups(cfg *Config) error {
	if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
		return fmt.Errorf("cgroup namespace: %w", err)
	}
	if cfg.Root != "" {
		return nil
	}
	if fi, err := os.Stat(CgroupMount); err != nil || !fi.IsDir() {
		return nil // nothing there to hide
	}
	flags := uintptr(unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
	if err := mountIn(cfg, "tmpfs", CgroupMount, "tmpfs", flags, "mode=0555,size=4k"); err != nil {
		return fmt.Errorf("hide %s: %w", CgroupMount, err)
	}
	return nil
}

// privatePTS binds the lease's devpts instance on /dev/pts and its ptmx on /dev/ptmx, in
// the private mount namespace only (privateTmp made its mounts private): PTYs the lease
// opens come from its own instance, bounded by its max. A root without an instance gets
// the host's.
func privatePTS(cfg *Config) error {
	if err := inPrivateNS(cfg, "/dev/pts"); err != nil {
		return err
	}
	pts, ptmx := cfg.PTSDir, "/dev/pts/ptmx"
	switch {
	case cfg.Root != "" && pts == "":
		pts, ptmx = "/dev/pts", "/dev/ptmx"
	case cfg.Root != "":
		ptmx = pts + "/ptmx" // the host's /dev/pts is not the lease's
	}
	if err := mountIn(cfg, pts, "/dev/pts", "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s on /dev/pts: %w", pts, err)
	}
	if err := mountIn(cfg, ptmx, "/dev/ptmx", "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s on /dev/ptmx: %w", ptmx, err)
	}
	return nil
}

// inPrivateNS refuses a mount on dst unless the helper is in a mount namespace of its own
// whose mounts privateTmp made private: a mount must never land in the daemon's namespace.
func inPrivateNS(cfg *Config, dst string) error {
	ns, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return fmt.Errorf("mount namespace: %w", err)
	}
	if cfg.TmpDir == "" || cfg.HostMountNS == "" || ns == cfg.HostMountNS {
		return fmt.Errorf("refusing to mount %s: not in a private mount namespace", dst)
	}
	return nil
}

// bindPrivate binds src on dst in the private mount namespace (the lease's passwd, group
// and resolv.conf files over the host's).
func bindPrivate(cfg *Config, src, dst string) error {
	if err := inPrivateNS(cfg, dst); err != nil {
		return err
	}
	if err := mountIn(cfg, src, dst, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s on %s: %w", src, dst, err)
	}
	return nil
}

// privateBind binds a lease directory (its home tree, its workdir) on dst, nosuid and
// nodev like /tmp.
func privateBind(cfg *Config, src, dst string) error {
	if err := bindPrivate(cfg, src, dst); err != nil {
		return err
	}
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_NOSUID | unix.MS_NODEV)
	if err := mountIn(cfg, "", dst, "", flags, ""); err != nil {
		return fmt.Errorf("remount %s nosuid,nodev: %w", dst, err)
	}
	return nil
}

// LeaseOOMScoreAdj is the OOM score adjustment of every lease process.
const LeaseOOMScoreAdj = "500"

// LeaseUmask is the umask every lease process starts with.
const LeaseUmask = 0o022

// RootCaps are the capabilities root holds in a lease's user namespace (Config.UserNS),
// whatever the daemon holds: Docker's default set, so that an image's installers see what
// they see under the docker provider. Those that act on the host's namespaces
// (CAP_NET_RAW, CAP_NET_BIND_SERVICE, CAP_MKNOD, CAP_AUDIT_WRITE) are inert there: the
// lease's user namespace owns none. The C helper applies it (ROOT_CAPS).
const RootCaps uint64 = 1<<unix.CAP_CHOWN | 1<<unix.CAP_DAC_OVERRIDE | 1<<unix.CAP_FOWNER |
	1<<unix.CAP_FSETID | 1<<unix.CAP_KILL | 1<<unix.CAP_SETGID | 1<<unix.CAP_SETUID |
	1<<unix.CAP_SETPCAP | 1<<unix.CAP_NET_BIND_SERVICE | 1<<unix.CAP_NET_RAW |
	1<<unix.CAP_SYS_CHROOT | 1<<unix.CAP_MKNOD | 1<<unix.CAP_AUDIT_WRITE | 1<<unix.CAP_SETFCAP

// dropPrivileges uses raw system calls on purpose: the syscall package's wrappers change
// every thread (and fail in cgo binaries); only this thread will exec.
func dropPrivileges(uid, gid int) error {
	if _, _, errno := unix.RawSyscall(unix.SYS_SETGROUPS, 0, 0, 0); errno != 0 {
		return fmt.Errorf("setgroups: %w", errno)
	}
	if _, _, errno := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(gid), uintptr(gid), uintptr(gid)); errno != 0 {
		return fmt.Errorf("setresgid %d: %w", gid, errno)
	}
	if _, _, errno := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(uid), uintptr(uid), uintptr(uid)); errno != 0 {
		return fmt.Errorf("setresuid %d: %w", uid, errno)
	}
	return nil
}

// execTarget looks the program up like execvp does, inside the sandbox, and execs it. It
// returns only on failure, with the exit code that says why.
func execTarget(cfg *Config) (int, error) {
	name := cfg.Argv[0]
	if strings.Contains(name, "/") {
		err := unix.Exec(name, cfg.Argv, cfg.Env)
		return execCode(err), fmt.Errorf("%s: %w", name, err)
	}
	path := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	for _, kv := range cfg.Env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	var denied error
	for dir := range strings.SplitSeq(path, ":") {
		if !strings.HasPrefix(dir, "/") {
			continue // relative PATH entries are a trap (Go's exec.ErrDot), skip them
		}
		err := unix.Exec(dir+"/"+name, cfg.Argv, cfg.Env)
		switch {
		case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR):
		case errors.Is(err, unix.EACCES):
			denied = err
		default:
			return execCode(err), fmt.Errorf("%s: %w", name, err)
		}
	}
	if denied != nil {
		return ExitCannotExec, fmt.Errorf("%s: %w", name, denied)
	}
	return ExitNotFound, fmt.Errorf("%s: executable file not found in $PATH", name)
}

func execCode(err error) int {
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
		return ExitNotFound
	}
	return ExitCannotExec
}

// fail tells the daemon why on the report pipe (and the caller's stderr, which is all a
// user of a plain exec.Cmd would see), then exits with code.
func fail(code int, stage string, err error) {
	msg := fmt.Sprintf("%s: %v", stage, err)
	if len(msg) > reportMaxLength {
		msg = msg[:reportMaxLength]
	}
	unix.Write(ReportFD, []byte(strconv.Itoa(code)+" "+msg))
	fmt.Fprintf(os.Stderr, "sidecar-init: %s\n", msg)
	os.Exit(code)
}
