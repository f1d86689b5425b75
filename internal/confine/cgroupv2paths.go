package confine

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Where lease cgroups go on cgroup v2. Two ways a daemon is started:
//
//   - Delegated: systemd gave the daemon's unit its own subtree (Delegate=yes), or no
//     cgroup manager runs and the daemon sits alone in its cgroup. The no-internal-
//     processes rule says a cgroup handing controllers to children holds no processes, so
//     the daemon moves into a leaf, <own>/daemon, and leases go under <own>/<parent>.
//   - By hand: root started it from a shell, whose cgroup (a login session's scope) holds
//     other processes and belongs to systemd. The daemon stays where it is — outside the
//     subtree it manages, so never in one of its internal nodes — and leases go under
//     <mount>/<parent>, with the controllers enabled on every level down to it.
//
// From the root cgroup (which the rule exempts) leases go under <mount>/<parent> too.

// v2Paths computes, from /proc/self/cgroup, the daemon's leaf ("" when the daemon stays
// where it is) and the parent of lease cgroups. delegated says whether the daemon's own
// cgroup directory is its to manage.
func v2Paths(procSelfCgroup, mount, parent string, delegated func(ownDir string) bool) (leaf, base string, err error) {
	for line := range strings.SplitSeq(procSelfCgroup, "\n") {
		own, ok := strings.CutPrefix(line, "0::")
		if !ok {
			continue
		}
		own = filepath.Clean("/" + own)
		ownDir := filepath.Join(mount, own)
		if own == "/" {
			return "", filepath.Join(mount, parent), nil
		}
		if filepath.Base(own) == "daemon" { // already moved by an earlier New
			ownDir = filepath.Dir(ownDir)
		} else if !delegated(ownDir) {
			return "", filepath.Join(mount, parent), nil
		}
		return filepath.Join(ownDir, "daemon"), filepath.Join(ownDir, parent), nil
	}
	return "", "", errors.New("no cgroup v2 entry in /proc/self/cgroup")
}

// hostV2Delegated is v2Delegated on this host: systemd runs when /run/systemd/system
// exists (sd_booted(3)).
func hostV2Delegated(ownDir string) bool {
	_, err := os.Stat("/run/systemd/system")
	return v2Delegated(ownDir, os.Getenv, os.Getpid(), err == nil)
}

// v2Delegated says whether the cgroup ownDir is the daemon's to manage: systemd marked it
// delegated (the trusted.delegate or user.delegate xattr, systemd ≥ 251), or the daemon
// is a systemd service (INVOCATION_ID, a ".service" cgroup: older systemd with
// Delegate=yes), or no systemd runs and the daemon (pid) is alone in it.
func v2Delegated(ownDir string, getenv func(string) string, pid int, systemd bool) bool {
	for _, name := range []string{"trusted.delegate", "user.delegate"} {
		buf := make([]byte, 8)
		if n, err := unix.Getxattr(ownDir, name, buf); err == nil && string(buf[:n]) == "1" {
			return true
		}
	}
	if getenv("INVOCATION_ID") != "" && strings.HasSuffix(ownDir, ".service") {
		return true
	}
	if systemd {
		return false
	}
	procs, err := os.ReadFile(filepath.Join(ownDir, "cgroup.procs"))
	return err == nil && strings.TrimSpace(string(procs)) == strconv.Itoa(pid)
}
