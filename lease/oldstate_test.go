package lease

import (
	"encoding/json"
	"fmt"
	"path/filepath"
)

// The previous version's writer of leases.json, kept to make the state dirs that the
// upgrade tests read.
// saveState wrote leases to dir/leases.json atomically.
func saveState(dir string, leases []Lease) error {
	st := stateFile{Version: stateVersion, Leases: make([]storedLease, len(leases))}
	for i, l := range leases {
		st.Leases[i] = toStored(l)
	}
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	if err := writeFileAtomic(filepath.Join(dir, stateFileName), append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("lease: save state: %w", err)
	}
	return nil
}
