package sandbox

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrOutsideWorkdir is ErrInvalid for a path that resolves outside the lease's workdir.
var ErrOutsideWorkdir = fmt.Errorf("%w: path outside the workdir", ErrInvalid)

// DefaultPath is the PATH a lease process starts with, followed by the operator's
// Config.LeasePath.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// LeasePathDirs parses SIDECAR_LEASE_PATH: directories separated by ':', each absolute,
// clean and inside the system directories lease processes may run programs from
// (systemExecDirs: what Landlock lets them execute, and where a start looks for
// argv[0]); an empty entry is refused rather than read as the cwd, as a shell would.
// "" is none.
func LeasePathDirs(s string) ([]string, error) {
	if s == "" {
		return nil, nil
	}
	var dirs []string
	for d := range strings.SplitSeq(s, ":") {
		switch {
		case d == "":
			return nil, fmt.Errorf("%w: SIDECAR_LEASE_PATH %q has an empty entry (a leading, trailing or doubled ':')", ErrInvalid, s)
		case !filepath.IsAbs(d) || filepath.Clean(d) != d:
			return nil, fmt.Errorf("%w: SIDECAR_LEASE_PATH entry %q is not a clean absolute path", ErrInvalid, d)
		case !inAny(d, systemExecDirs):
			return nil, fmt.Errorf("%w: SIDECAR_LEASE_PATH entry %q is outside the directories lease processes may run programs from (%s)",
				ErrInvalid, d, strings.Join(systemExecDirs, ", "))
		}
		dirs = append(dirs, d)
	}
	return dirs, nil
}

// leasePath is the PATH of lease processes: DefaultPath, then dirs (see LeasePathDirs),
// each of which must be a directory on the host.
func leasePath(dirs []string) (string, error) {
	if _, err := LeasePathDirs(strings.Join(dirs, ":")); err != nil {
		return "", err
	}
	for _, d := range dirs {
		if st, err := os.Stat(d); err != nil || !st.IsDir() {
			return "", fmt.Errorf("%w: SIDECAR_LEASE_PATH entry %q is not a directory on this host", ErrInvalid, d)
		}
	}
	return strings.Join(append([]string{DefaultPath}, dirs...), ":"), nil
}

// maxArgEnvBytes bounds argv plus environment, well under the kernel's ARG_MAX.
const maxArgEnvBytes = 1 << 20

// identity is who a lease process is told it is: its home and, in $USER and $LOGNAME,
// its user name; $SHELL its login shell.
type identity struct{ home, user, shell string }

// identity is LeaseUser at home in Workspace with strict isolation (the name its user
// database gives the lease's uid), root in a lease that runs as root (its home is the
// lease's all the same: on the lease's disk, out of the image); with isolation none, the
// daemon's user, whose uid the process has, at home in the workdir's host path.
func (s *Sandbox) identity(v view, root *LeaseRoot) identity {
	id := identity{home: v.home, user: LeaseUser, shell: s.shell}
	if root != nil && root.AsRoot {
		id.user = "root"
	}
	if !s.strict() {
		id.user = "sidecar"
		if u, err := user.Current(); err == nil && u.Username != "" {
			id.user = u.Username
		}
	}
	return id
}

// xdgDirs are the XDG base directories under a lease's own home.
var xdgDirs = map[string]string{
	"XDG_CACHE_HOME": ".cache", "XDG_CONFIG_HOME": ".config", "XDG_DATA_HOME": ".local/share", "XDG_STATE_HOME": ".local/state",
}

// leaseIdentityEnv are what an image's environment may not set: who and where the lease
// process is.
var leaseIdentityEnv = []string{"HOME", "USER", "LOGNAME", "SHELL", "TMPDIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME"}

// imageEnv is what of a lease root's environment applies (KEY=VALUE): all but
// leaseIdentityEnv; nil for the host's root.
func imageEnv(r *LeaseRoot) []string {
	if r == nil {
		return nil
	}
	var env []string
	for _, kv := range r.Env {
		if k, _, _ := strings.Cut(kv, "="); !slices.Contains(leaseIdentityEnv, k) {
			env = append(env, kv)
		}
	}
	return env
}

// envValue is the value of key in env (KEY=VALUE entries), "" if unset.
func envValue(env []string, key string) string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, key+"="); ok {
			return v
		}
	}
	return ""
}

// buildEnv is the clean base environment, then the lease's (KEY=VALUE), with the request's
// on top, sorted. TERM is set for a terminal only, as ssh and docker exec do.
func buildEnv(id identity, path, tmp string, tty bool, lease []string, req map[string]string) ([]string, error) {
	env := map[string]string{
		"PATH": path, "HOME": id.home, "LANG": "C.UTF-8", "SHELL": id.shell,
		"USER": id.user, "LOGNAME": id.user, "TMPDIR": tmp,
	}
	if tty {
		env["TERM"] = "xterm-256color"
	}
	if id.home == LeaseHome {
		// A home of its own: tools that read XDG variables rather than default them from
		// HOME keep their caches, settings and data there too, never in the workdir.
		for k, sub := range xdgDirs {
			env[k] = LeaseHome + "/" + sub
		}
	}
	for _, kv := range lease {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	for k, v := range req {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return nil, fmt.Errorf("%w: environment variable %q", ErrInvalid, k)
		}
		env[k] = v
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out, nil
}

func validateArgv(argv []string, env []string) error {
	if len(argv) == 0 || argv[0] == "" {
		return fmt.Errorf("%w: empty argv", ErrInvalid)
	}
	size := 0
	for _, a := range argv {
		if strings.ContainsRune(a, 0) {
			return fmt.Errorf("%w: NUL in argv", ErrInvalid)
		}
		size += len(a) + 1
	}
	for _, e := range env {
		size += len(e) + 1
	}
	if size > maxArgEnvBytes {
		return fmt.Errorf("%w: argv and environment exceed %d bytes", ErrInvalid, maxArgEnvBytes)
	}
	return nil
}

// resolveDir turns Spec.Dir (relative to the workdir, or absolute under Workspace) into a
// clean path relative to the workdir, refusing anything that leaves the workdir by "..",
// another absolute path or a symlink.
func resolveDir(workdir, p string) (string, error) {
	rel, ok := workspaceRel(p)
	if !ok {
		return "", fmt.Errorf("%w: %q", ErrOutsideWorkdir, p)
	}
	if rel == "" || rel == "." {
		return ".", nil
	}
	if !filepath.IsLocal(rel) {
		return "", fmt.Errorf("%w: %q", ErrOutsideWorkdir, p)
	}
	root, err := os.OpenRoot(workdir)
	if err != nil {
		return "", err
	}
	defer root.Close()
	st, err := root.Stat(rel)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("%w: no directory %q", ErrInvalid, rel)
	case err != nil:
		return "", fmt.Errorf("%w: %q: %v", ErrOutsideWorkdir, rel, err)
	case !st.IsDir():
		return "", fmt.Errorf("%w: %q is not a directory", ErrInvalid, rel)
	}
	return filepath.Clean(rel), nil
}

// Landlock policy: what a lease may reach besides its workdir and /tmp. The system
// directories are enough for sh, coreutils, python, git and node.
var (
	systemExecDirs = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt"}
	systemReadDirs = []string{"/etc", "/proc", "/sys", "/run/systemd/resolve"}
	deviceFiles    = []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty", "/dev/ptmx", "/dev/pts"}
)

// under reports whether p is dir or inside it, and the relative rest.
func under(p, dir string) (string, bool) {
	if p == dir {
		return ".", true
	}
	rest, ok := strings.CutPrefix(p, dir+"/")
	return rest, ok && rest != ""
}

// findExecutable checks, before anything starts, that argv[0] names an executable the
// lease can reach, so that "python: not found" is a start error. It looks at the
// filesystem as the lease will (dir and the paths are the lease's names): the workdir and
// /tmp through os.Root (a symlink cannot point it elsewhere), system directories as they
// are. The helper repeats the lookup inside the sandbox and has the last word.
func findExecutable(v view, name, pathEnv, dir string) error {
	if strings.Contains(name, "/") {
		p := name
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if executableInView(v, filepath.Clean(p)) {
			return nil
		}
		return fmt.Errorf("exec: %q: %w", name, errNotFound)
	}
	for entry := range strings.SplitSeq(pathEnv, ":") {
		if filepath.IsAbs(entry) && executableInView(v, filepath.Join(entry, name)) {
			return nil
		}
	}
	return fmt.Errorf("exec: %q: %w", name, errNotFound)
}

func executableInView(v view, p string) bool {
	var st fs.FileInfo
	var err error
	if rel, ok := under(p, v.work); ok {
		st, err = rootStat(v.workHost, rel)
	} else if rel, ok := under(p, "/tmp"); ok && v.tmpHost != "" {
		st, err = rootStat(v.tmpHost, rel)
	} else if v.root != "" {
		st, err = statInRoot(v.root, p)
	} else if inAny(p, systemExecDirs) {
		// System directories are the host's, read-only to leases: following their
		// symlinks is safe, but the target must stay where Landlock allows execution.
		// A PATH search misses in most directories: one stat each tells it before the
		// walk of every component.
		if _, err := os.Stat(p); err != nil {
			return false
		}
		var real string
		if real, err = filepath.EvalSymlinks(p); err == nil && inAny(real, systemExecDirs) {
			st, err = os.Stat(real)
		} else if err == nil {
			return false
		}
	} else {
		return false
	}
	return err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0
}

// probeOpenat2 reports whether openat2(2), which statInRoot and the helper use, works.
func probeOpenat2() error {
	how := unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT}
	fd, err := unix.Openat2(unix.AT_FDCWD, "/", &how)
	if err != nil {
		return fmt.Errorf("openat2: %w", err)
	}
	return unix.Close(fd)
}

// statInRoot stats p in a lease's root as the lease resolves it: symlinks, absolute ones
// too, stay inside the root (RESOLVE_IN_ROOT), as after the helper's pivot_root.
func statInRoot(root, p string) (fs.FileInfo, error) {
	dir, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dir)
	how := unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS}
	fd, err := unix.Openat2(dir, p, &how)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	return f.Stat()
}

func rootStat(dir, rel string) (fs.FileInfo, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	return root.Stat(rel)
}

func inAny(p string, dirs []string) bool {
	for _, d := range dirs {
		if _, ok := under(p, d); ok {
			return true
		}
	}
	return false
}
