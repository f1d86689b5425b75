package lease

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/sidecar-sandbox/sidecar/lease/netpolicy"
)

// stateVersion is the version of leases.json, the format before the journal
// (journal.go): read once, to upgrade a state dir in place.
const stateVersion = 1

const stateFileName = "leases.json"

// stateFile is the on-disk shape of leases.json. It is separate from Lease so that the
// format changes only on purpose.
type stateFile struct {
	Version int           `json:"version"`
	Leases  []storedLease `json:"leases"`
}

type storedLease struct {
	ID             string            `json:"id"`
	SessionID      string            `json:"session_id"`
	Labels         map[string]string `json:"labels,omitempty"`
	Network        netpolicy.Policy  `json:"network"` // older states hold "host" or "none"
	Image          string            `json:"image,omitempty"`
	Limits         storedLimits      `json:"limits"`
	UID            int               `json:"uid,omitempty"`
	GID            int               `json:"gid,omitempty"`
	CreatedAt      time.Time         `json:"created_at"`
	ExpiresAt      time.Time         `json:"expires_at"`
	LastActivityAt time.Time         `json:"last_activity_at"`
}

type storedLimits struct {
	MemoryBytes   int64 `json:"memory_bytes,omitempty"`
	CPUMillicores int64 `json:"cpu_millicores,omitempty"`
	Pids          int64 `json:"pids,omitempty"`
	DiskBytes     int64 `json:"disk_bytes,omitempty"`
}

func toStored(l Lease) storedLease {
	return storedLease{
		ID: l.ID, SessionID: l.SessionID, Labels: l.Labels, Network: l.Network, Image: l.Image,
		Limits: storedLimits(l.Limits), UID: l.UID, GID: l.GID,
		CreatedAt: l.CreatedAt, ExpiresAt: l.ExpiresAt, LastActivityAt: l.LastActivityAt,
	}
}

// fromStored rebuilds a lease; its Dir is derived from workRoot, never read from disk.
func fromStored(s storedLease, workRoot string) (Lease, error) {
	if !validID(s.ID) {
		return Lease{}, fmt.Errorf("lease id %q is malformed", s.ID)
	}
	if err := checkSessionID(s.SessionID); err != nil {
		return Lease{}, fmt.Errorf("lease %s: %w", s.ID, err)
	}
	if s.Network.Egress == "host" {
		// A lease from before leases had networks of their own: it had the host's
		// network, which the internet policy is closest to.
		s.Network = netpolicy.Policy{Egress: netpolicy.EgressInternet}
	}
	if err := netpolicy.CheckSyntax(s.Network); err != nil {
		return Lease{}, fmt.Errorf("lease %s: %w", s.ID, err)
	}
	if s.UID < 0 || s.GID < 0 || s.CreatedAt.IsZero() || s.ExpiresAt.IsZero() {
		return Lease{}, fmt.Errorf("lease %s: bad uid, gid or times", s.ID)
	}
	return Lease{
		ID: s.ID, SessionID: s.SessionID, Labels: s.Labels, Network: s.Network, Image: s.Image,
		Limits: Limits(s.Limits), UID: s.UID, GID: s.GID, Dir: filepath.Join(workRoot, s.ID),
		CreatedAt: s.CreatedAt, ExpiresAt: s.ExpiresAt, LastActivityAt: s.LastActivityAt,
	}, nil
}

// loadState reads dir/leases.json; a missing file is an empty state. A file that cannot be
// read back is copied aside to leases.json.corrupt-<timestamp> and refused with
// ErrCorruptState: starting empty would orphan every lease it holds.
func loadState(dir, workRoot string, now time.Time) ([]Lease, error) {
	path := filepath.Join(dir, stateFileName)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("lease: read state: %w", err)
	}
	leases, err := decodeState(data, workRoot)
	if err == nil {
		return leases, nil
	}
	aside := fmt.Sprintf("%s.corrupt-%s", path, now.UTC().Format("20060102T150405.000000000Z"))
	if cpErr := createFileAtomic(aside, data, 0o600); cpErr != nil {
		return nil, fmt.Errorf("%w: %s: %v (copying it aside failed too: %v)", ErrCorruptState, path, err, cpErr)
	}
	return nil, fmt.Errorf("%w: %s: %v; copied to %s: inspect it, then remove or repair %s to start",
		ErrCorruptState, path, err, aside, path)
}

func decodeState(data []byte, workRoot string) ([]Lease, error) {
	var st stateFile
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, err
	}
	if st.Version != stateVersion {
		return nil, fmt.Errorf("format version %d, this daemon reads %d", st.Version, stateVersion)
	}
	seen, uids := map[string]bool{}, map[int]string{}
	leases := make([]Lease, 0, len(st.Leases))
	for _, s := range st.Leases {
		l, err := fromStored(s, workRoot)
		if err != nil {
			return nil, err
		}
		if seen[l.ID] {
			return nil, fmt.Errorf("lease %s listed twice", l.ID)
		}
		seen[l.ID] = true
		if other, dup := uids[l.UID]; dup && l.UID != 0 {
			return nil, fmt.Errorf("leases %s and %s share uid %d", other, l.ID, l.UID)
		}
		uids[l.UID] = l.ID
		leases = append(leases, l)
	}
	return leases, nil
}
