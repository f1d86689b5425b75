package sandbox

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// One host may run several daemons (a service and a developer's instance, say). Each
// sweeps and kills every lease cgroup under its parent that its own state does not know,
// so two daemons must never share a parent: a daemon claims its parent for its lifetime
// with a lock file naming its pid and state dir, and a second daemon on the same parent
// is refused, told whom it collides with. The lock is an flock: it goes with the process
// however that ends, so a crashed daemon never blocks its successor.

// ownerDir holds one lock file per claimed cgroup parent. /run is a tmpfs, emptied at boot
// like the cgroups themselves.
var ownerDir = "/run/sidecar/cgroup-owners"

// ownerRecord is what a lock file says about the daemon holding it.
type ownerRecord struct {
	PID          int       `json:"pid"`
	StateDir     string    `json:"state_dir"`
	CgroupParent string    `json:"cgroup_parent"`
	Since        time.Time `json:"since"`
}

// ErrParentOwned: another running daemon owns the cgroup parent.
var ErrParentOwned = errors.New("cgroup parent owned by another running daemon")

// ownerLock is a held claim on a cgroup parent.
type ownerLock struct {
	f    *os.File
	path string
}

// Close gives the claim up. A daemon that leaves no lease behind also removes the lock
// file, so a host that starts many daemons (a test suite) does not collect them; one that
// leaves leases for its successor keeps the record, so a daemon of another state dir
// taking the parent over says whose leftovers it sweeps. The file is unlinked while still
// locked: a daemon that opened it before and locks it after finds it unlinked
// (claimParent checks) and starts over on a new file, so no two ever hold one parent.
func (l *ownerLock) Close(leasesLeft bool) error {
	var err error
	if !leasesLeft {
		if err = os.Remove(l.path); errors.Is(err, os.ErrNotExist) {
			err = nil
		}
	}
	return errors.Join(err, l.f.Close())
}

// claimParent takes the lock on key for the daemon with stateDir, or fails with
// ErrParentOwned naming the daemon holding it. The lock is held until Close.
func claimParent(dir, key, stateDir string, log *slog.Logger) (*ownerLock, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("sandbox: cgroup parent owners: %w", err)
	}
	sum := sha256.Sum256([]byte(key))
	path := filepath.Join(dir, hex.EncodeToString(sum[:8])+".lock")
	// A few rounds at most: each one that fails found a file its holder unlinked on the
	// way out, and the next finds the new one or none.
	for range 8 {
		l, err := lockOwnerFile(path, key, stateDir, log)
		if !errors.Is(err, errLockFileGone) {
			return l, err
		}
	}
	return nil, fmt.Errorf("sandbox: lock %s: replaced under us repeatedly", path)
}

// errLockFileGone: the locked file was unlinked by its previous holder; lock the path anew.
var errLockFileGone = errors.New("lock file unlinked")

func lockOwnerFile(path, key, stateDir string, log *slog.Logger) (*ownerLock, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("sandbox: cgroup parent owners: %w", err)
	}
	var prev ownerRecord
	b, _ := io.ReadAll(io.LimitReader(f, 64<<10))
	_ = json.Unmarshal(b, &prev) // an empty or torn record only loses the name
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			// Re-read: the holder may have written its record after our first read.
			if b, err := os.ReadFile(path); err == nil {
				_ = json.Unmarshal(b, &prev)
			}
			return nil, fmt.Errorf("%w: %s is held by pid %d with state dir %s (since %s; lock %s): give this daemon its own SIDECAR_CGROUP_PARENT (or state dir), or stop that one",
				ErrParentOwned, key, prev.PID, prev.StateDir, prev.Since.Format(time.RFC3339), path)
		}
		return nil, fmt.Errorf("sandbox: lock %s: %w", path, err)
	}
	if !samePath(f, path) {
		f.Close()
		return nil, errLockFileGone
	}
	if prev.StateDir != "" && prev.StateDir != stateDir {
		log.Warn("taking over a cgroup parent last used by another daemon, no longer running: its lease cgroups left there are swept as orphans",
			"cgroup_parent", key, "previous_pid", prev.PID, "previous_state_dir", prev.StateDir)
	}
	rec, _ := json.Marshal(ownerRecord{PID: os.Getpid(), StateDir: stateDir, CgroupParent: key, Since: time.Now().UTC()})
	if err := writeRecord(f, append(rec, '\n')); err != nil {
		f.Close()
		return nil, fmt.Errorf("sandbox: write %s: %w", path, err)
	}
	return &ownerLock{f: f, path: path}, nil
}

// samePath reports whether path still names the open file f.
func samePath(f *os.File, path string) bool {
	var held, named unix.Stat_t
	if unix.Fstat(int(f.Fd()), &held) != nil || unix.Stat(path, &named) != nil {
		return false
	}
	return held.Dev == named.Dev && held.Ino == named.Ino
}

func writeRecord(f *os.File, rec []byte) error {
	if err := f.Truncate(0); err != nil {
		return err
	}
	_, err := f.WriteAt(rec, 0)
	return err
}
