package lease

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// The lease table lives in an append-only journal, leases.journal: one record per change,
// each appended and fsynced before the change is acknowledged, so an operation costs one
// small durable write whatever the number of leases (leases.json, rewritten whole on every
// change, cost 17 ms with 10 leases held and 54 ms with 1,000 on the CI machine). It is
// compacted (rewritten atomically as one record per lease) by Run, by Close, and inline
// when it has grown far past the table, so it stays a few times the table's size.
//
// Why a journal and not an embedded store (bbolt): the record is ours and tiny, a change
// needs one fsync (a bbolt transaction does two: data pages, then the meta page), the
// package keeps to the standard library, and the format reads with a dozen lines.
//
// Format: the header line journalMagic, then records: a 4-byte big-endian payload length,
// the payload's CRC-32C (4 bytes, big-endian), and the payload, a journalRecord in JSON.
// Replaying the records in order gives the table. A record cut short, failing its
// checksum at the end of the file, or a tail of zeros is a write torn by a crash: it was
// never acknowledged, so it is dropped (and cut off) and the rest kept. Anything else that
// does not read back is corruption: refused, as leases.json was.
const (
	journalFileName = "leases.journal"
	journalMagic    = "sidecar-leases-journal 2\n" // 2: leases.json was version 1
	maxRecordBytes  = 1 << 20                      // a lease is < 2 KiB; labels are bounded
	// compactSlack: the journal is compacted inline once it holds this many records
	// beyond compactFactor times the leases in the table; Run compacts well before.
	compactSlack  = 4096
	compactFactor = 4
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// journalRecord is one change: Put (the lease as it now is) or Del (the id of a lease
// gone).
type journalRecord struct {
	Put *storedLease `json:"put,omitempty"`
	Del string       `json:"del,omitempty"`
}

// journal is the open state journal. Its methods are called with Manager.persistMu held.
type journal struct {
	path    string
	f       *os.File // append handle; nil until the first append after open or compaction
	size    int64    // bytes known written and synced
	records int      // records in the file
	// broken: an append failed and could not be cut back, so the bytes after size are
	// unknown; the next write compacts instead of appending.
	broken bool
	// compactions counts compactions: a change whose record failed may still be in the
	// journal if one ran meanwhile (it writes the whole table).
	compactions int
}

// appendRecords writes recs and fsyncs them. On failure the file is cut back to what it
// held before, so a failed change leaves the journal byte for byte as it was.
func (j *journal) appendRecords(recs ...journalRecord) error {
	if j.broken {
		return errors.New("journal needs compaction")
	}
	var buf bytes.Buffer
	for _, r := range recs {
		if err := encodeRecord(&buf, r); err != nil {
			return err
		}
	}
	if j.f == nil {
		f, err := os.OpenFile(j.path, os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		j.f = f
	}
	_, err := j.f.WriteAt(buf.Bytes(), j.size)
	if err == nil {
		err = j.f.Sync()
	}
	if err != nil {
		if cutErr := j.cut(); cutErr != nil {
			j.broken = true
			err = fmt.Errorf("%w (cutting the record back failed too: %v)", err, cutErr)
		}
		return err
	}
	j.size += int64(buf.Len())
	j.records += len(recs)
	return nil
}

// encodeRecord appends r to buf: length, CRC-32C, JSON payload.
func encodeRecord(buf *bytes.Buffer, r journalRecord) error {
	payload, err := json.Marshal(r)
	if err != nil {
		return err
	}
	var hdr [8]byte
	binary.BigEndian.PutUint32(hdr[:4], uint32(len(payload)))
	binary.BigEndian.PutUint32(hdr[4:], crc32.Checksum(payload, crcTable))
	buf.Write(hdr[:])
	buf.Write(payload)
	return nil
}

// cut truncates the file to the bytes known good.
func (j *journal) cut() error {
	if err := j.f.Truncate(j.size); err != nil {
		return err
	}
	return j.f.Sync()
}

// compact replaces the journal with one record per lease, atomically: a crash leaves the
// old journal or the new one.
func (j *journal) compact(leases []Lease) error {
	var buf bytes.Buffer
	buf.WriteString(journalMagic)
	for _, l := range leases {
		s := toStored(l)
		if err := encodeRecord(&buf, journalRecord{Put: &s}); err != nil {
			return err
		}
	}
	if err := writeFileAtomic(j.path, buf.Bytes(), 0o600); err != nil {
		return fmt.Errorf("lease: save state: %w", err)
	}
	j.close() // the handle points at the replaced file
	j.size, j.records, j.broken = int64(buf.Len()), len(leases), false
	j.compactions++
	return nil
}

// compactDue reports whether the journal has grown past its inline bound for a table of
// n leases.
func (j *journal) compactDue(n int) bool {
	return j.broken || j.records > compactSlack+compactFactor*n
}

func (j *journal) close() {
	if j.f != nil {
		_ = j.f.Close()
		j.f = nil
	}
}

// openJournal loads the lease table from dir. Without a journal it reads leases.json, the
// format before it, writes the journal from it and removes leases.json: the state dir is
// upgraded in place. A torn tail is logged through warn and cut off.
func openJournal(dir, workRoot string, now time.Time, warn func(msg string, args ...any)) (*journal, []Lease, error) {
	j := &journal{path: filepath.Join(dir, journalFileName)}
	data, err := os.ReadFile(j.path)
	if errors.Is(err, fs.ErrNotExist) {
		leases, err := loadState(dir, workRoot, now) // leases.json, version 1
		if err != nil {
			return nil, nil, err
		}
		if err := j.compact(leases); err != nil {
			return nil, nil, err
		}
		if err := removeOldState(dir); err != nil {
			return nil, nil, err
		}
		return j, leases, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("lease: read state: %w", err)
	}
	leases, good, records, err := decodeJournal(data, workRoot)
	if err != nil {
		aside := fmt.Sprintf("%s.corrupt-%s", j.path, now.UTC().Format("20060102T150405.000000000Z"))
		if cpErr := createFileAtomic(aside, data, 0o600); cpErr != nil {
			return nil, nil, fmt.Errorf("%w: %s: %v (copying it aside failed too: %v)", ErrCorruptState, j.path, err, cpErr)
		}
		return nil, nil, fmt.Errorf("%w: %s: %v; copied to %s: inspect it, then remove or repair %s to start",
			ErrCorruptState, j.path, err, aside, j.path)
	}
	j.size, j.records = int64(good), records
	if good < len(data) {
		warn("lease journal: dropping a torn last record (a write cut by a crash, never acknowledged)",
			"path", j.path, "kept_bytes", good, "dropped_bytes", len(data)-good)
		f, err := os.OpenFile(j.path, os.O_WRONLY, 0)
		if err != nil {
			return nil, nil, fmt.Errorf("lease: cut torn journal tail: %w", err)
		}
		j.f = f
		if err := j.cut(); err != nil {
			j.close()
			return nil, nil, fmt.Errorf("lease: cut torn journal tail: %w", err)
		}
	}
	// An upgrade that crashed after writing the journal left leases.json behind.
	if err := removeOldState(dir); err != nil {
		j.close()
		return nil, nil, err
	}
	return j, leases, nil
}

func removeOldState(dir string) error {
	err := os.Remove(filepath.Join(dir, stateFileName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		return fmt.Errorf("lease: remove %s after the upgrade to %s: %w", stateFileName, journalFileName, err)
	}
	return nil
}

// decodeJournal replays data. good is the length of the part that reads back whole: less
// than len(data) only when the rest is a torn last record.
func decodeJournal(data []byte, workRoot string) (leases []Lease, good, records int, err error) {
	if !bytes.HasPrefix(data, []byte(journalMagic)) {
		return nil, 0, 0, fmt.Errorf("not a lease journal (want the header %q)", journalMagic[:len(journalMagic)-1])
	}
	table := map[string]storedLease{}
	var order []string // first appearance, for a stable result
	off := len(journalMagic)
	for off < len(data) {
		rest := data[off:]
		payload, ok := recordAt(rest)
		if !ok {
			if tornTail(rest) {
				return tableLeases(table, order, workRoot, off, records)
			}
			return nil, 0, 0, fmt.Errorf("record at byte %d does not read back, and is not a torn last write", off)
		}
		n := len(payload)
		var r journalRecord
		if err := json.Unmarshal(payload, &r); err != nil {
			return nil, 0, 0, fmt.Errorf("record at byte %d: %v", off, err)
		}
		switch {
		case r.Put != nil && r.Del == "":
			if _, ok := table[r.Put.ID]; !ok {
				order = append(order, r.Put.ID)
			}
			table[r.Put.ID] = *r.Put
		case r.Put == nil && r.Del != "":
			delete(table, r.Del)
		default:
			return nil, 0, 0, fmt.Errorf("record at byte %d: neither put nor del", off)
		}
		off += 8 + n
		records++
	}
	return tableLeases(table, order, workRoot, off, records)
}

func tableLeases(table map[string]storedLease, order []string, workRoot string, good, records int) ([]Lease, int, int, error) {
	uids := map[int]string{}
	var leases []Lease
	for _, id := range order {
		s, ok := table[id]
		if !ok {
			continue // deleted
		}
		l, err := fromStored(s, workRoot)
		if err != nil {
			return nil, 0, 0, err
		}
		if other, dup := uids[l.UID]; dup && l.UID != 0 {
			return nil, 0, 0, fmt.Errorf("leases %s and %s share uid %d", other, l.ID, l.UID)
		}
		uids[l.UID] = l.ID
		leases = append(leases, l)
	}
	return leases, good, records, nil
}

// recordAt returns the payload of the record at the start of b, if a whole one with a
// good checksum is there.
func recordAt(b []byte) ([]byte, bool) {
	if len(b) < 8 {
		return nil, false
	}
	n := int(binary.BigEndian.Uint32(b[:4]))
	if n == 0 || n > maxRecordBytes || 8+n > len(b) {
		return nil, false
	}
	payload := b[8 : 8+n]
	return payload, crc32.Checksum(payload, crcTable) == binary.BigEndian.Uint32(b[4:8])
}

// tornTail reports whether rest, which does not start with a good record, is what a crash
// leaves of the one append in flight: zeros, or no bigger than one record and holding no
// good record further in (a damaged record with good ones after it is corruption, whose
// records must not be dropped in silence).
func tornTail(rest []byte) bool {
	if allZero(rest) {
		return true
	}
	if len(rest) > 8+maxRecordBytes {
		return false
	}
	for i := 1; i+8 < len(rest); i++ {
		if _, ok := recordAt(rest[i:]); ok {
			return false
		}
	}
	return true
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
