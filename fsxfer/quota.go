package fsxfer

import (
	"context"
	"errors"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// meter accounts the disk usage of a lease: a periodic scan of the usage root (allocated
// blocks) plus the bytes of writes in progress, which the scan skips by inode so they are
// never counted twice. A write reserves space before each chunk it writes; the chunk that
// would go over the quota is refused.
type meter struct {
	root  string
	quota int64 // 0: unlimited
	ttl   time.Duration
	now   func() time.Time

	scanMu sync.Mutex // one scan at a time

	mu          sync.Mutex
	scanned     int64 // last scan, adjusted by writes finished since
	scannedAt   time.Time
	valid       bool
	active      map[fileKey]*reservation
	activeBytes int64
	skipping    map[fileKey]bool // what the scan in progress skips
	skipDelta   int64            // kept bytes of skipped writes that finished during the scan
}

type fileKey struct{ dev, ino uint64 }

func keyOf(st *unix.Stat_t) fileKey { return fileKey{dev: st.Dev, ino: st.Ino} }

func newMeter(root string, quota int64, ttl time.Duration, now func() time.Time) *meter {
	return &meter{root: root, quota: quota, ttl: ttl, now: now, active: map[fileKey]*reservation{}}
}

// reservation is the space held by one write in progress: a file (or a staging directory
// tree) the scan must skip.
type reservation struct {
	m     *meter
	key   fileKey
	bytes int64
}

// begin registers a write to the file or directory key, which already holds existing
// bytes (a partial upload being appended to). Those were counted by the scan, so they
// move from the scanned figure to the reservation.
func (m *meter) begin(key fileKey, existing int64) *reservation {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := &reservation{m: m, key: key, bytes: existing}
	m.scanned = max(0, m.scanned-existing)
	m.active[key] = r
	m.activeBytes += existing
	return r
}

// grow reserves n more bytes, or fails with ErrQuota when that would exceed the quota.
func (r *reservation) grow(n int64) error {
	m := r.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.quota > 0 && m.scanned+m.activeBytes+n > m.quota {
		return ErrQuota
	}
	r.bytes += n
	m.activeBytes += n
	return nil
}

// end finishes the write; kept is what stays on disk (0 when it was removed).
func (r *reservation) end(kept int64) {
	m := r.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.active[r.key] != r {
		return
	}
	delete(m.active, r.key)
	m.activeBytes -= r.bytes
	m.scanned += kept
	if m.skipping[r.key] {
		m.skipDelta += kept
	}
}

// usage is the scanned usage plus writes in progress, scanning again when the last scan
// is older than the TTL.
func (m *meter) usage(ctx context.Context) (int64, error) {
	if u, ok := m.fresh(); ok {
		return u, nil
	}
	m.scanMu.Lock()
	defer m.scanMu.Unlock()
	if u, ok := m.fresh(); ok { // another caller scanned while this one waited
		return u, nil
	}
	m.mu.Lock()
	m.skipping = make(map[fileKey]bool, len(m.active))
	for k := range m.active {
		m.skipping[k] = true
	}
	m.skipDelta = 0
	skip := m.skipping
	m.mu.Unlock()

	total, err := scanUsage(ctx, m.root, skip)

	m.mu.Lock()
	defer m.mu.Unlock()
	m.skipping = nil
	if err != nil {
		return 0, err
	}
	m.scanned = total + m.skipDelta
	m.scannedAt = m.now()
	m.valid = true
	return m.scanned + m.activeBytes, nil
}

func (m *meter) fresh() (int64, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.valid || m.now().Sub(m.scannedAt) >= m.ttl {
		return 0, false
	}
	return m.scanned + m.activeBytes, true
}

// scanUsage sums the allocated blocks under root, counting hard-linked files once and
// never crossing a mount point; skip holds writes in progress.
func scanUsage(ctx context.Context, root string, skip map[fileKey]bool) (int64, error) {
	dfd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer unix.Close(dfd)
	id, err := identify(dfd)
	if err != nil {
		return 0, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(dfd, &st); err != nil {
		return 0, err
	}
	total := st.Blocks * 512
	seen := map[fileKey]bool{}
	err = walk(ctx, dfd, id.mnt, "", 0, func(e walkEntry) (bool, error) {
		k := keyOf(e.st)
		if skip[k] {
			return false, nil
		}
		if e.st.Nlink > 1 && e.st.Mode&unix.S_IFMT != unix.S_IFDIR {
			if seen[k] {
				return false, nil
			}
			seen[k] = true
		}
		total += e.st.Blocks * 512
		return true, nil
	})
	return total, err
}

// Usage is the bytes under the usage root (allocated blocks) plus writes in progress.
// A scan is reused for Config.UsageTTL.
func (f *FS) Usage(ctx context.Context) (int64, error) {
	return f.meter.usage(ctx)
}

// blockRound rounds n up to whole 4 KiB blocks, what the filesystem will allocate.
func blockRound(n int64) int64 { return (n + 4095) &^ 4095 }

// invalidate makes the next usage call scan again (after a removal of unknown size).
func (m *meter) invalidate() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.valid = false
}

// forget takes n bytes the daemon just removed off the scanned figure.
func (m *meter) forget(n int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.scanned = max(0, m.scanned-n)
}

// quotaBase makes sure a write under a quota starts from a recent scan. Without a quota
// there is nothing to enforce, and no scan is paid for.
func (f *FS) quotaBase(ctx context.Context) error {
	if f.cfg.QuotaBytes == 0 {
		return nil
	}
	_, err := f.meter.usage(ctx)
	return err
}
