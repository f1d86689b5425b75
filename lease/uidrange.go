package lease

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// A lease's uid is what keeps it apart from other leases wherever Landlock does not reach
// (and on kernels without Landlock scoping, everywhere), so two daemons on one host must
// never hand out the same uids. Each claims its range for its lifetime with a record in
// DefaultUIDOwners, locked while it runs; a daemon whose range overlaps a running one's is
// refused, told whose. A crashed daemon's lock goes with its process.

// DefaultUIDOwners holds one record per running daemon's uid range; /run is emptied at
// boot, like the processes the ranges were for.
const DefaultUIDOwners = "/run/sidecar/uid-ranges"

// ErrUIDRangeOwned: the range overlaps that of another running daemon.
var ErrUIDRangeOwned = errors.New("uid range overlaps another running daemon's")

// Derived ranges: one block of uidBlock uids out of uidBlocks, from uidBase on, picked by
// the state dir's path. legacyUIDRange is what every daemon had before ranges were derived,
// kept by a state dir that already holds leases.
const (
	uidBase        = 265536
	uidBlock       = 65536
	uidBlocks      = 4096
	legacyUIDRange = "200000-265535"
	uidRangeFile   = "uid-range"
)

type uidRecord struct {
	PID         int       `json:"pid"`
	StateDir    string    `json:"state_dir"`
	First, Last int       `json:"-"`
	Range       string    `json:"range"`
	Since       time.Time `json:"since"`
}

// uidClaim is a held claim on a uid range.
type uidClaim struct {
	f    *os.File
	path string
}

// claimUIDRange records first-last as the range of the daemon with stateDir, or fails with
// ErrUIDRangeOwned naming the running daemon it overlaps. nil for no range.
func claimUIDRange(dir, stateDir string, first, last int) (*uidClaim, error) {
	if first == 0 {
		return nil, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("lease: uid range owners: %w", err)
	}
	// The directory's lock makes the check and the claim one step among starting daemons.
	dl, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lease: uid range owners: %w", err)
	}
	defer dl.Close()
	if err := unix.Flock(int(dl.Fd()), unix.LOCK_EX); err != nil {
		return nil, fmt.Errorf("lease: lock uid range owners: %w", err)
	}
	sum := sha256.Sum256([]byte(stateDir))
	own := filepath.Join(dir, hex.EncodeToString(sum[:8])+".json")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("lease: uid range owners: %w", err)
	}
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		if path == own || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		rec, live := readLiveUIDRecord(path)
		if live && rec.First <= last && first <= rec.Last {
			return nil, fmt.Errorf("%w: %d-%d overlaps %s of the daemon with state dir %s (pid %d): give each daemon on a host its own SIDECAR_UID_RANGE",
				ErrUIDRangeOwned, first, last, rec.Range, rec.StateDir, rec.PID)
		}
	}
	f, err := os.OpenFile(own, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lease: uid range owners: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("%w: a daemon with state dir %s is running already", ErrUIDRangeOwned, stateDir)
	}
	rec, _ := json.Marshal(uidRecord{PID: os.Getpid(), StateDir: stateDir, Range: fmt.Sprintf("%d-%d", first, last), Since: time.Now().UTC()})
	err = f.Truncate(0)
	if err == nil {
		_, err = f.WriteAt(append(rec, '\n'), 0)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lease: write %s: %w", own, err)
	}
	return &uidClaim{f: f, path: own}, nil
}

// readLiveUIDRecord reads the record at path if a running daemon holds it; a record
// nobody holds is a daemon gone, and is removed.
func readLiveUIDRecord(path string) (uidRecord, bool) {
	var rec uidRecord
	f, err := os.Open(path)
	if err != nil {
		return rec, false
	}
	defer f.Close()
	if unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB) == nil {
		_ = os.Remove(path)
		return rec, false
	}
	b, err := os.ReadFile(path)
	if err != nil || json.Unmarshal(b, &rec) != nil {
		return rec, false
	}
	if _, err := fmt.Sscanf(rec.Range, "%d-%d", &rec.First, &rec.Last); err != nil {
		return rec, false
	}
	return rec, true
}

func (c *uidClaim) close() {
	if c == nil {
		return
	}
	_ = os.Remove(c.path)
	_ = c.f.Close()
}

// DefaultUIDRange is the uid range of the daemon with stateDir when the operator names
// none: recorded in the state dir on first use, so it never changes under its leases. A
// state dir that holds leases from before ranges were derived keeps the range every daemon
// had then; a new one gets a block picked by its path.
func DefaultUIDRange(stateDir string) (first, last int, err error) {
	path := filepath.Join(stateDir, uidRangeFile)
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		if _, err := fmt.Sscanf(strings.TrimSpace(string(b)), "%d-%d", &first, &last); err != nil || first <= 0 || last < first {
			return 0, 0, fmt.Errorf("lease: %s holds %q, not FIRST-LAST: fix it or set SIDECAR_UID_RANGE", path, b)
		}
		return first, last, nil
	case !errors.Is(err, fs.ErrNotExist):
		return 0, 0, fmt.Errorf("lease: %w", err)
	}
	r := derivedUIDRange(stateDir)
	if _, err := os.Stat(filepath.Join(stateDir, stateFileName)); err == nil {
		r = legacyUIDRange
	}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return 0, 0, fmt.Errorf("lease: state dir: %w", err)
	}
	if err := writeFileAtomic(path, []byte(r+"\n"), 0o600); err != nil {
		return 0, 0, fmt.Errorf("lease: record the uid range: %w", err)
	}
	_, _ = fmt.Sscanf(r, "%d-%d", &first, &last)
	return first, last, nil
}

func derivedUIDRange(stateDir string) string {
	abs, err := filepath.Abs(stateDir)
	if err != nil {
		abs = stateDir
	}
	sum := sha256.Sum256([]byte(abs))
	first := uidBase + int(binary.BigEndian.Uint32(sum[:4])%uidBlocks)*uidBlock
	return fmt.Sprintf("%d-%d", first, first+uidBlock-1)
}
