package sandbox

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/sidecar-sandbox/sidecar/internal/confine/initproc"
)

// A lease process sees its workdir at Workspace and its uid as the user LeaseUser: with
// strict isolation the helper binds the workdir on Workspace and the lease's own passwd
// and group files over /etc's, all inside the process's private mount namespace. So `pwd`,
// $HOME, `whoami` and every path a lease program prints are the same on every host, and the
// host's layout (the work root, the lease id) never reaches the lease. With isolation
// "none" there is no namespace: processes see the host paths and run as the daemon's user.

// Workspace is the lease workdir as lease processes see it (strict isolation), and the
// absolute name the API accepts for it.
const Workspace = initproc.Workspace

// LeaseUser is the name of every lease's uid (and of its group) inside the lease.
const LeaseUser = "user"

// HomeMount is where a lease's home tree (LeaseSpec.HomeDir) is bound; its HOME is
// LeaseHome there, a directory of the lease's own.
const (
	HomeMount = initproc.HomeMount
	LeaseHome = HomeMount + "/" + LeaseUser
)

// ensureWorkspace makes the mount point of the leases' workdir binds: an empty root-owned
// directory, created at start when missing. A read-only root (systemd's
// ProtectSystem=strict) cannot get one: `make install` creates it.
func ensureWorkspace() error {
	err := os.Mkdir(Workspace, 0o755)
	if err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("sandbox: mount point %s for the lease workdirs: %w (create it as an empty root-owned directory: install -d -m 0755 %s; make install does)", Workspace, err, Workspace)
	}
	if err == nil {
		if err := os.Chmod(Workspace, 0o755); err != nil { // past the umask
			return fmt.Errorf("sandbox: mount point %s: %w", Workspace, err)
		}
	}
	st, err := os.Lstat(Workspace)
	if err != nil {
		return fmt.Errorf("sandbox: mount point %s: %w", Workspace, err)
	}
	if !st.IsDir() {
		// A symlink would move every lease's bind wherever it points.
		return fmt.Errorf("sandbox: mount point %s is not a directory (%s): leases bind their workdir there", Workspace, st.Mode().Type())
	}
	return nil
}

// view is how a lease's processes name its directories: Workspace and /tmp in their mount
// namespace, the host paths without one.
type view struct {
	work     string // the workdir as the lease names it
	home     string // the lease's HOME: LeaseHome when its home tree is bound, else work
	homeHost string // the home tree on the host, when bound on HomeMount; ""
	workHost string // the workdir on the host
	tmpHost  string // the lease's tmp dir when it is what /tmp shows; "" otherwise
	root     string // the lease's root (merged overlay) on the host; "" for the host's root
}

func (s *Sandbox) view(l LeaseSpec) view {
	if !s.caps.PrivateTmp {
		return view{work: l.Workdir, home: l.Workdir, workHost: l.Workdir}
	}
	v := view{work: Workspace, home: Workspace, workHost: l.Workdir, tmpHost: l.TmpDir}
	if l.Root != nil {
		v.root = leaseRootDirs(l).merged
	}
	if l.HomeDir != "" && (s.hostHome || l.Root != nil) {
		v.home, v.homeHost = LeaseHome, l.HomeDir
	}
	return v
}

// provisionHome makes the lease's home tree when it will be bound: root-owned 0755 (the
// lease cannot replace what /home holds) with the lease's own HOME in it, 0700.
func (s *Sandbox) provisionHome(l LeaseSpec) error {
	v := s.view(l)
	if v.homeHost == "" {
		return nil
	}
	st, err := os.Lstat(v.homeHost)
	if err != nil || !st.IsDir() {
		return fmt.Errorf("%w: home dir %s: not a directory (%v)", ErrInvalid, v.homeHost, err)
	}
	if err := os.Chmod(v.homeHost, 0o755); err != nil {
		return fmt.Errorf("sandbox: chmod %s: %w", v.homeHost, err)
	}
	home := filepath.Join(v.homeHost, LeaseUser)
	if err := os.Mkdir(home, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("sandbox: lease %s home: %w", l.ID, err)
	}
	return ownDir(home, l.UID, l.GID)
}

// workspaceRel turns an exec's working directory (relative to the workdir, or absolute
// under Workspace in any isolation mode) into one relative to the workdir; false for any
// other absolute path.
func workspaceRel(p string) (string, bool) {
	if !filepath.IsAbs(p) {
		return p, true
	}
	rest, ok := strings.CutPrefix(p, Workspace)
	if !ok || (rest != "" && rest[0] != '/') {
		return "", false
	}
	if rest = strings.TrimLeft(rest, "/"); rest == "" {
		return ".", true
	}
	return rest, true
}

// userDB is what the lease's /etc/passwd and /etc/group say: root and nobody as the host
// names them (without group members), and the lease's uid as LeaseUser, home Workspace.
type userDB struct {
	root, nobody   string // the host's passwd lines for uid 0 and 65534
	rootG, nobodyG string // the host's group lines for gid 0 and 65534, members dropped
	shell          string // loginShell
}

// Host accounts the lease keeps, and what stands in for them on a host without them.
const (
	nobodyID      = "65534"
	defaultRoot   = "root:x:0:0:root:/root:/bin/sh"
	defaultNobody = "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin"
	defaultRootG  = "root:x:0:"
	defaultNobodG = "nogroup:x:65534:"
)

// loadUserDB reads what the lease files keep of the host's; ok is false when the host
// has no /etc/passwd or /etc/group file to bind over (a minimal image): leases then see
// the host's view, where their uid has no name.
func loadUserDB() (db userDB, ok bool) {
	for _, f := range []string{"/etc/passwd", "/etc/group"} {
		if st, err := os.Stat(f); err != nil || !st.Mode().IsRegular() {
			return db, false
		}
	}
	db = userDB{root: defaultRoot, nobody: defaultNobody, rootG: defaultRootG, nobodyG: defaultNobodG, shell: loginShell()}
	if b, err := os.ReadFile("/etc/passwd"); err == nil {
		db.root = hostEntry(string(b), "0", 7, db.root)
		db.nobody = hostEntry(string(b), nobodyID, 7, db.nobody)
	}
	if b, err := os.ReadFile("/etc/group"); err == nil {
		db.rootG = hostEntry(string(b), "0", 4, db.rootG)
		db.nobodyG = hostEntry(string(b), nobodyID, 4, db.nobodyG)
	}
	return db, true
}

// loginShell is the lease user's shell: bash where the host has it, else sh.
func loginShell() string {
	if st, err := os.Stat("/bin/bash"); err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0 {
		return "/bin/bash"
	}
	return "/bin/sh"
}

// hostEntry is the first line of a passwd (7 fields) or group (4 fields) file whose id
// (the third field) is id, with its password field "x" and, for a group, no members.
func hostEntry(file, id string, fields int, fallback string) string {
	for line := range strings.SplitSeq(file, "\n") {
		f := strings.Split(line, ":")
		if len(f) != fields || f[2] != id || f[0] == "" || f[0] == LeaseUser {
			continue
		}
		f[1] = "x"
		if fields == 4 {
			f[3] = ""
		}
		return strings.Join(f, ":")
	}
	return fallback
}

// files are the lease's passwd and group contents.
func (db userDB) files(uid, gid int, home string) (passwd, group string) {
	u, g := strconv.Itoa(uid), strconv.Itoa(gid)
	passwd = db.root + "\n" + db.nobody + "\n" + LeaseUser + ":x:" + u + ":" + g + ":" + LeaseUser + ":" + home + ":" + db.shell + "\n"
	group = db.rootG + "\n" + db.nobodyG + "\n" + LeaseUser + ":x:" + g + ":\n"
	return passwd, group
}

// writeUserFiles writes lease id's passwd and group under the user root (root-owned, 0644,
// each replaced atomically: a process binding them sees a whole file) and returns their
// paths.
func (s *Sandbox) writeUserFiles(l LeaseSpec) (passwd, group, resolv string, err error) {
	dir := filepath.Join(s.userRoot, l.ID)
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", "", "", fmt.Errorf("sandbox: lease %s users: %w", l.ID, err)
	}
	p, g := s.users.files(l.UID, l.GID, s.view(l).home)
	passwd, group = filepath.Join(dir, "passwd"), filepath.Join(dir, "group")
	files := []struct{ path, data string }{{passwd, p}, {group, g}}
	if l.Network != nil && l.Network.ResolvConf != "" {
		if _, err := os.Stat("/etc/resolv.conf"); err == nil { // a bind needs its target
			resolv = filepath.Join(dir, "resolv.conf")
			files = append(files, struct{ path, data string }{resolv, l.Network.ResolvConf})
		}
	}
	for _, f := range files {
		if err := writeFileAtomic(f.path, f.data); err != nil {
			return "", "", "", fmt.Errorf("sandbox: lease %s users: %w", l.ID, err)
		}
	}
	return passwd, group, resolv, nil
}

func writeFileAtomic(path, data string) error {
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o644); err != nil { // past the umask
		return err
	}
	return os.Rename(tmp, path)
}

// removeUserFiles removes what writeUserFiles made for lease id (never a mount point: the
// files are bound only inside lease namespaces, at /etc).
func (s *Sandbox) removeUserFiles(id string) error {
	if s.userRoot == "" {
		return nil
	}
	if err := os.RemoveAll(filepath.Join(s.userRoot, id)); err != nil {
		return fmt.Errorf("sandbox: remove lease %s users: %w", id, err)
	}
	return nil
}

// sweepUserFiles removes what an earlier run left under root: Provision writes restored
// leases' files again.
func sweepUserFiles(root string) error {
	entries, err := os.ReadDir(root)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if leaseIDPattern.MatchString(e.Name()) {
			errs = append(errs, os.RemoveAll(filepath.Join(root, e.Name())))
		}
	}
	return errors.Join(errs...)
}
