package process

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// record is what survives a restart of one background process. The environment is
// never written: it may carry secrets.
type record struct {
	Lease     string     `json:"lease"`
	ID        string     `json:"id"`
	Argv      []string   `json:"argv"`
	TTY       bool       `json:"tty"`
	State     string     `json:"state"`
	StartedAt time.Time  `json:"started_at"`
	EndedAt   *time.Time `json:"ended_at,omitempty"`
	ExitCode  *int       `json:"exit_code,omitempty"`
	Signal    string     `json:"signal,omitempty"`
	TimedOut  bool       `json:"timed_out,omitempty"`
	OOMKilled bool       `json:"oom_killed,omitempty"`
}

// store keeps one JSON file per process in dir; an empty dir keeps nothing.
type store struct{ dir string }

const tempPrefix = ".tmp-"

// name hashes lease and id so that any lease id makes a short, safe file name.
func (s store) name(lease, id string) string {
	h := sha256.Sum256([]byte(lease + "\x00" + id))
	return filepath.Join(s.dir, hex.EncodeToString(h[:16])+".json")
}

// save writes rec atomically: a temp file, fsync, rename, fsync of the directory.
func (s store) save(rec record) error {
	if s.dir == "" {
		return nil
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(s.dir, tempPrefix+"*")
	if err != nil {
		return err
	}
	_, werr := f.Write(b)
	serr := f.Sync()
	cerr := f.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		_ = os.Remove(f.Name())
		return err
	}
	if err := os.Rename(f.Name(), s.name(rec.Lease, rec.ID)); err != nil {
		_ = os.Remove(f.Name())
		return err
	}
	return s.syncDir()
}

func (s store) remove(lease, id string) error {
	if s.dir == "" {
		return nil
	}
	if err := os.Remove(s.name(lease, id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

func (s store) syncDir() error {
	d, err := os.Open(s.dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// load reads every record, removing temp files a crash left behind. A file that does
// not parse is skipped and reported in bad.
func (s store) load() (recs []record, bad []string, err error) {
	if s.dir == "" {
		return nil, nil, nil
	}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return nil, nil, err
	}
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, nil, err
	}
	for _, e := range entries {
		path := filepath.Join(s.dir, e.Name())
		switch {
		case strings.HasPrefix(e.Name(), tempPrefix):
			_ = os.Remove(path)
			continue
		case !e.Type().IsRegular() || filepath.Ext(e.Name()) != ".json":
			continue
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, nil, err
		}
		var rec record
		if err := json.Unmarshal(b, &rec); err != nil || rec.Lease == "" || rec.ID == "" || path != s.name(rec.Lease, rec.ID) {
			bad = append(bad, fmt.Sprintf("%s: %v", e.Name(), err))
			continue
		}
		recs = append(recs, rec)
	}
	return recs, bad, nil
}
