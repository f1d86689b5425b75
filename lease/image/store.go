// Package image is the lease image store: the operator's OCI images (SIDECAR_IMAGES),
// fetched and verified by digest, each layer unpacked once into a content-addressed
// directory that overlayfs can stack as a lowerdir, shared by every image and lease that
// holds it, and removed when none does.
//
// On disk, under Config.Dir (<state dir>/images):
//
//	layers/sha256/<diffid hex>/   a layer's tree, with overlayfs whiteouts
//	records/<name>.json           a pulled image or a snapshot: digest, layers, Env, WorkingDir, User
//	tmp/                          unpacks in progress (emptied at Open)
//
// A layer directory appears by rename once its unpack finished and its content matched
// its diffid, so a crash or a refused layer leaves no layer behind, only tmp/ debris.
package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
)

// Sentinel errors; returned errors wrap them with detail.
var (
	ErrUnknown  = errors.New("unknown image")             // not a name of SIDECAR_IMAGES
	ErrNotReady = errors.New("image not ready")           // not pulled yet, being pulled, or the pull failed
	ErrInUse    = errors.New("image in use")              // a lease holds it (Remove)
	ErrPulling  = errors.New("image is being pulled")     // Remove during a pull
	ErrRefused  = errors.New("layer refused")             // hostile or malformed layer content
	ErrDigest   = errors.New("image digest mismatch")     // content does not match its digest
	ErrFull     = errors.New("image store limit reached") // SIDECAR_IMAGE_STORE_BYTES
	ErrExists   = errors.New("image name taken")          // a snapshot named like an image
	ErrChanged  = errors.New("lease changed during snapshot")
	ErrSnapshot = errors.New("a snapshot has no source") // pulling one
)

// Image states (Info.State).
const (
	StateAbsent  = "absent"  // listed but not in the store (removed, or never pulled)
	StatePulling = "pulling" // a pull is running
	StateReady   = "ready"   // in the store: leases may use it
	StateFailed  = "failed"  // the last pull failed (Info.Error); POST …/pull retries
	StateSaving  = "saving"  // a snapshot being written
)

// DefaultMaxBytes is SIDECAR_IMAGE_STORE_BYTES' default: what all unpacked layers may
// take on disk.
const DefaultMaxBytes = 20 << 30

// Config configures a Store.
type Config struct {
	Dir      string  // <state dir>/images
	Images   []Entry // SIDECAR_IMAGES
	MaxBytes int64   // SIDECAR_IMAGE_STORE_BYTES; 0: DefaultMaxBytes
	// SnapshotMaxAge is SIDECAR_SNAPSHOT_MAX_AGE: snapshots older than this are removed
	// once no lease runs on them; 0 keeps them until removed.
	SnapshotMaxAge time.Duration
	Logger         *slog.Logger
}

// Info describes one image (GET /v1/images).
type Info struct {
	Name, Ref string
	Digest    string // the manifest's, "sha256:…"; "" until pulled
	Size      int64  // bytes its unpacked layers take (charged against the store limit)
	State     string
	Progress  float64 // of a pull: the share of the layers' compressed bytes done, 0 to 1
	InUse     int     // leases holding it
	Error     string  // of a failed pull
	Snapshot  *SnapshotInfo
}

// SnapshotInfo is what a snapshot image adds to its Info.
type SnapshotInfo struct {
	Base    string    // the listed image it descends from (through other snapshots)
	Lease   string    // the lease it was taken of
	Created time.Time // when
	Expires time.Time // when it goes (SIDECAR_SNAPSHOT_MAX_AGE); zero: never
}

// Root is what a lease runs on: the image's layers and its config's defaults.
type Root struct {
	Name, Digest string
	// Base is the listed image the root descends from: Name, or a snapshot's base.
	Base string
	// Seed is a snapshot's own layer, whose SnapshotWorkspace and SnapshotHome trees a
	// new lease's workspace and home start as (CopyTree); "" for a listed image.
	Seed       string
	Layers     []string // unpacked layer directories, top first (overlayfs lowerdir order)
	Env        []string
	WorkingDir string
	User       string
}

// record is a pulled image, as records/<name>.json holds it.
type record struct {
	Name, Ref, Digest string
	Layers            []layerRecord // bottom first, as the manifest lists them
	Env               []string
	WorkingDir, User  string
	Snapshot          *snapshotRecord `json:",omitempty"`
}

type snapshotRecord struct {
	Base, Lease string
	Created     time.Time
}

type layerRecord struct {
	DiffID string // "sha256:…"
	Bytes  int64
}

func (r *record) size() int64 {
	var n int64
	for _, l := range r.Layers {
		n += l.Bytes
	}
	return n
}

// image is one name's state.
type image struct {
	ref        string
	configured bool    // in SIDECAR_IMAGES
	snapshot   bool    // a snapshot: kept until removed or aged; otherwise, unlisted, kept only while leases hold it
	rec        *record // nil: not in the store
	state      string
	progress   float64
	err        string
	inUse      int
}

// Store is the image store. Its methods are safe for concurrent use.
type Store struct {
	dir    string
	max    int64
	maxAge time.Duration // of snapshots; 0: none
	log    *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu         sync.Mutex
	images     map[string]*image
	layerBytes map[string]int64         // layers on disk, by diffid
	layerRefs  map[string]int           // layers held by leases' Roots
	unpacking  map[string]chan struct{} // layers being unpacked; closed when done
	used       int64                    // layerBytes' sum plus what unpacks have charged
}

// Open opens (or makes) the store and adopts what a previous run left: images whose
// record matches their configured reference are ready at once; records of names no
// longer configured are kept until GC finds no lease on them.
func Open(cfg Config) (*Store, error) {
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	if cfg.MaxBytes < 0 {
		return nil, fmt.Errorf("SIDECAR_IMAGE_STORE_BYTES=%d: want a positive size", cfg.MaxBytes)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.SnapshotMaxAge < 0 {
		return nil, fmt.Errorf("SIDECAR_SNAPSHOT_MAX_AGE=%s: want a positive duration, or 0 to keep snapshots until removed", cfg.SnapshotMaxAge)
	}
	s := &Store{dir: cfg.Dir, max: cfg.MaxBytes, maxAge: cfg.SnapshotMaxAge, log: cfg.Logger, images: map[string]*image{},
		layerBytes: map[string]int64{}, layerRefs: map[string]int{}, unpacking: map[string]chan struct{}{}}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	for _, d := range []string{s.layersDir(), s.recordsDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("image store: %w", err)
		}
	}
	// Unpacks a crash interrupted: no mount ever lies in tmp/, so removing it is safe.
	if err := os.RemoveAll(s.tmpDir()); err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	if err := os.MkdirAll(s.tmpDir(), 0o700); err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	for _, e := range cfg.Images {
		if err := CheckName(e.Name); err != nil {
			return nil, err
		}
		if _, err := parseSource(e.Ref); err != nil {
			return nil, fmt.Errorf("image %s: %w", e.Name, err)
		}
		s.images[e.Name] = &image{ref: e.Ref, configured: true, state: StateAbsent}
	}
	if err := s.adopt(); err != nil {
		return nil, err
	}
	if s.maxAge > 0 {
		s.wg.Add(1)
		go s.expireLoop()
	}
	return s, nil
}

func (s *Store) layersDir() string  { return filepath.Join(s.dir, "layers", "sha256") }
func (s *Store) recordsDir() string { return filepath.Join(s.dir, "records") }
func (s *Store) tmpDir() string     { return filepath.Join(s.dir, "tmp") }

// layerDir is where the layer of diffid ("sha256:hex") is unpacked.
func (s *Store) layerDir(diffID string) string {
	return filepath.Join(s.layersDir(), strings.TrimPrefix(diffID, "sha256:"))
}

// adopt reads the records a previous run left. A record whose layers are not all on
// disk is dropped (its image is pulled again).
func (s *Store) adopt() error {
	ents, err := os.ReadDir(s.recordsDir())
	if err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	for _, de := range ents {
		n, ok := strings.CutSuffix(de.Name(), ".json")
		if !ok || CheckName(n) != nil {
			continue
		}
		rec, err := s.readRecord(n)
		if err != nil || !s.layersPresent(rec) {
			s.log.Warn("dropping an image record that cannot be used", "image", n, "err", err)
			_ = os.Remove(filepath.Join(s.recordsDir(), de.Name()))
			continue
		}
		im := s.images[n]
		if im != nil && rec.Snapshot != nil {
			return fmt.Errorf("image store: SIDECAR_IMAGES names %q, a snapshot in the store: list the image under another name, or remove the snapshot first (DELETE /v1/images/%s)", n, n)
		}
		if im == nil {
			im = &image{ref: rec.Ref, snapshot: rec.Snapshot != nil}
			s.images[n] = im
		}
		im.rec, im.state = rec, StateReady
		for _, l := range rec.Layers {
			if _, ok := s.layerBytes[l.DiffID]; !ok {
				s.layerBytes[l.DiffID] = l.Bytes
				s.used += l.Bytes
			}
		}
	}
	return nil
}

func (s *Store) readRecord(n string) (*record, error) {
	b, err := os.ReadFile(filepath.Join(s.recordsDir(), n+".json"))
	if err != nil {
		return nil, err
	}
	var rec record
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, err
	}
	if rec.Name != n {
		return nil, fmt.Errorf("the record of %q names %q", n, rec.Name)
	}
	return &rec, nil
}

func (s *Store) layersPresent(rec *record) bool {
	for _, l := range rec.Layers {
		if !validDiffID(l.DiffID) {
			return false
		}
		if fi, err := os.Lstat(s.layerDir(l.DiffID)); err != nil || !fi.IsDir() {
			return false
		}
	}
	return true
}

func validDiffID(d string) bool {
	h, ok := strings.CutPrefix(d, "sha256:")
	if !ok || len(h) != 64 {
		return false
	}
	_, err := hex.DecodeString(h)
	return err == nil && strings.ToLower(h) == h
}

func (s *Store) writeRecord(rec *record) error {
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(s.recordsDir(), ".tmp-")
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), filepath.Join(s.recordsDir(), rec.Name+".json"))
	}
	if err != nil {
		_ = os.Remove(f.Name())
	}
	return err
}

// Close stops the pulls in progress and waits for them.
func (s *Store) Close() {
	s.cancel()
	s.wg.Wait()
}

// Usage is what the unpacked layers take on disk (each once, with unpacks in progress)
// and the store's limit.
func (s *Store) Usage() (used, limit int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.used, s.max
}

// Known reports whether name is an image of SIDECAR_IMAGES or a snapshot.
func (s *Store) Known(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	im := s.images[name]
	return im != nil && (im.configured || im.snapshot)
}

// Check is the acquire's question: may a new lease use name now? ErrUnknown when it is
// not listed, ErrNotReady when it is not in the store.
func (s *Store) Check(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	im := s.images[name]
	switch {
	case im == nil || !(im.configured || im.snapshot):
		return fmt.Errorf("%w %q: the images are the operator's SIDECAR_IMAGES and the snapshots (GET /v1/images lists them)", ErrUnknown, name)
	case im.rec == nil:
		return notReady(name, im)
	}
	return nil
}

func notReady(name string, im *image) error {
	switch im.state {
	case StatePulling:
		return fmt.Errorf("%w: image %q is being pulled (%.0f%% done); retry shortly", ErrNotReady, name, im.progress*100)
	case StateFailed:
		return fmt.Errorf("%w: the pull of image %q failed (%s); POST /v1/images/%s/pull retries", ErrNotReady, name, im.err, name)
	case StateSaving:
		return fmt.Errorf("%w: snapshot %q is being written; retry shortly", ErrNotReady, name)
	}
	return fmt.Errorf("%w: image %q is not in the store; POST /v1/images/%s/pull fetches it", ErrNotReady, name, name)
}

// List describes every listed image (and those kept only for the leases on them), by name.
func (s *Store) List() []Info {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Info, 0, len(s.images))
	for n, im := range s.images {
		out = append(out, s.infoLocked(n, im))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Get describes one image.
func (s *Store) Get(name string) (Info, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	im := s.images[name]
	if im == nil {
		return Info{}, fmt.Errorf("%w %q", ErrUnknown, name)
	}
	return s.infoLocked(name, im), nil
}

func (s *Store) infoLocked(n string, im *image) Info {
	in := Info{Name: n, Ref: im.ref, State: im.state, Progress: im.progress, InUse: im.inUse, Error: im.err}
	if im.rec != nil {
		in.Digest, in.Size = im.rec.Digest, im.rec.size()
	}
	if in.State == StateReady {
		in.Progress = 1
	}
	if im.rec != nil && im.rec.Snapshot != nil {
		sn := im.rec.Snapshot
		in.Snapshot = &SnapshotInfo{Base: sn.Base, Lease: sn.Lease, Created: sn.Created}
		if s.maxAge > 0 {
			in.Snapshot.Expires = sn.Created.Add(s.maxAge)
		}
	}
	return in
}

// Use holds name's image for a lease: its layers stay on disk until release is
// called (once; later calls do nothing). A lease restored after a restart may use an
// image no longer listed, as long as the store still has it. While a pull replaces an
// image, Use gets the version already in the store.
func (s *Store) Use(name string) (*Root, func(), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	im := s.images[name]
	if im == nil {
		return nil, nil, fmt.Errorf("%w %q", ErrUnknown, name)
	}
	if im.rec == nil {
		return nil, nil, notReady(name, im)
	}
	rec := im.rec
	im.inUse++
	root := &Root{Name: name, Base: name, Digest: rec.Digest, Env: slices.Clone(rec.Env), WorkingDir: rec.WorkingDir, User: rec.User}
	if rec.Snapshot != nil {
		root.Base, root.Seed = rec.Snapshot.Base, s.layerDir(rec.Layers[len(rec.Layers)-1].DiffID)
	}
	for i := len(rec.Layers) - 1; i >= 0; i-- {
		d := rec.Layers[i].DiffID
		s.layerRefs[d]++
		root.Layers = append(root.Layers, s.layerDir(d))
	}
	var once sync.Once
	release := func() {
		once.Do(func() { s.release(name, im, rec) })
	}
	return root, release, nil
}

func (s *Store) release(name string, im *image, rec *record) {
	s.mu.Lock()
	im.inUse--
	for _, l := range rec.Layers {
		if s.layerRefs[l.DiffID]--; s.layerRefs[l.DiffID] <= 0 {
			delete(s.layerRefs, l.DiffID)
		}
	}
	retire := !im.configured && !im.snapshot && im.inUse == 0 && s.images[name] == im
	s.mu.Unlock()
	if retire {
		s.log.Info("removing an image no longer listed now that no lease uses it", "image", name)
		_ = s.drop(name, im)
	}
	s.GC()
}

// Remove deletes name's image from the store; its layers go unless another image or a
// lease holds them. It is refused (ErrInUse) while a lease uses the image, and
// (ErrPulling) while it is being pulled. A listed name stays listed, absent: a pull
// fetches it again.
func (s *Store) Remove(name string) error {
	s.mu.Lock()
	im := s.images[name]
	switch {
	case im == nil:
		s.mu.Unlock()
		return fmt.Errorf("%w %q", ErrUnknown, name)
	case im.inUse > 0:
		s.mu.Unlock()
		return fmt.Errorf("%w: %d lease(s) use image %q; release them first", ErrInUse, im.inUse, name)
	case im.state == StatePulling, im.state == StateSaving:
		s.mu.Unlock()
		return fmt.Errorf("%w: image %q; remove it once the pull or snapshot ends", ErrPulling, name)
	}
	s.mu.Unlock()
	if err := s.drop(name, im); err != nil {
		return err
	}
	s.GC()
	return nil
}

// drop deletes name's record; the entry stays if the name is listed.
func (s *Store) drop(name string, im *image) error {
	if err := os.Remove(filepath.Join(s.recordsDir(), name+".json")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	im.rec, im.state, im.err, im.progress = nil, StateAbsent, "", 0
	if !im.configured {
		delete(s.images, name)
	}
	return nil
}

// GC removes the unpacked layers no image record and no lease holds, and the records
// of unlisted images no lease holds. The daemon calls it once leases are restored.
func (s *Store) GC() {
	s.mu.Lock()
	var retired []string
	for n, im := range s.images {
		if !im.configured && !im.snapshot && im.inUse == 0 {
			retired = append(retired, n)
		}
	}
	s.mu.Unlock()
	for _, n := range retired {
		s.mu.Lock()
		im := s.images[n]
		s.mu.Unlock()
		if im != nil {
			_ = s.drop(n, im)
		}
	}
	ents, err := os.ReadDir(s.layersDir())
	if err != nil {
		s.log.Warn("image store: cannot list layers", "err", err)
		return
	}
	s.mu.Lock()
	keep := map[string]bool{}
	for _, im := range s.images {
		if im.rec != nil {
			for _, l := range im.rec.Layers {
				keep[l.DiffID] = true
			}
		}
	}
	var gone []string
	for _, de := range ents {
		d := "sha256:" + de.Name()
		if keep[d] || s.layerRefs[d] > 0 || s.unpacking[d] != nil {
			continue
		}
		gone = append(gone, d)
		s.used -= s.layerBytes[d]
		delete(s.layerBytes, d)
	}
	s.mu.Unlock()
	for _, d := range gone {
		// A layer directory never holds a mount (overlays only read it), so a plain
		// recursive removal is safe.
		if err := os.RemoveAll(s.layerDir(d)); err != nil {
			s.log.Warn("image store: cannot remove an unused layer", "layer", d, "err", err)
			continue
		}
		s.log.Info("image store: removed an unused layer", "layer", d)
	}
}

// PullAll starts a background pull of every listed image not in the store.
func (s *Store) PullAll() {
	s.mu.Lock()
	var names []string
	for n, im := range s.images {
		if im.configured && im.rec == nil {
			names = append(names, n)
		}
	}
	s.mu.Unlock()
	for _, n := range names {
		_ = s.Pull(n)
	}
}

// Pull fetches name's image in the background (again, when it is in the store: a tag
// may have moved); Info shows its progress. A pull already running is left to finish.
func (s *Store) Pull(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	im := s.images[name]
	if im != nil && im.snapshot {
		return fmt.Errorf("%w: %q is a snapshot, made from a lease (POST /v1/leases/{id}/snapshot): nothing to pull", ErrSnapshot, name)
	}
	if im == nil || !im.configured {
		return fmt.Errorf("%w %q: the images are the operator's SIDECAR_IMAGES", ErrUnknown, name)
	}
	if im.state == StatePulling {
		return nil
	}
	im.state, im.progress, im.err = StatePulling, 0, ""
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		err := s.pull(s.ctx, name, im)
		s.mu.Lock()
		if err != nil {
			im.err = err.Error()
			im.state = StateFailed
		} else {
			im.state, im.err = StateReady, ""
		}
		s.mu.Unlock()
		if err != nil {
			s.log.Warn("image pull failed", "image", name, "ref", im.ref, "err", err)
			return
		}
		s.log.Info("image pulled", "image", name, "ref", im.ref)
		s.GC() // the layers of the version it replaced, if any
	}()
	return nil
}

// pull fetches, verifies and unpacks the image, then records it. The chain checked is
// manifest → config (its digest) → each layer's uncompressed content (its diffid): a
// registry checks the manifest's digest when the reference names one, a layout's
// manifest is checked against its index.
func (s *Store) pull(ctx context.Context, name string, im *image) error {
	src, err := parseSource(im.ref)
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(s.tmpDir(), "source-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp) // an OCI archive's layout, if any: plain files
	img, err := src.open(ctx, tmp)
	if err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	m, err := img.Manifest()
	if err != nil {
		return err
	}
	cfg, err := verifiedConfig(img, m)
	if err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	if len(layers) != len(cfg.RootFS.DiffIDs) {
		return fmt.Errorf("%w: %d layers, %d diffids in the config", ErrDigest, len(layers), len(cfg.RootFS.DiffIDs))
	}
	var total, done int64
	for _, l := range m.Layers {
		total += l.Size
	}
	rec := &record{Name: name, Ref: im.ref, Digest: digest.String(), Env: cfg.Config.Env, WorkingDir: cfg.Config.WorkingDir, User: cfg.Config.User}
	defer s.unhold(rec)
	for i, l := range layers {
		diffID := cfg.RootFS.DiffIDs[i].String()
		n, err := s.ensureLayer(ctx, diffID, func() (int64, error) { return s.unpackLayer(ctx, diffID, l) })
		if err != nil {
			return fmt.Errorf("layer %d (%s): %w", i+1, diffID, err)
		}
		rec.Layers = append(rec.Layers, layerRecord{DiffID: diffID, Bytes: n})
		done += m.Layers[i].Size
		s.mu.Lock()
		if total > 0 {
			im.progress = float64(done) / float64(total)
		}
		s.mu.Unlock()
	}
	if err := s.writeRecord(rec); err != nil {
		return err
	}
	s.mu.Lock()
	im.rec = rec
	s.mu.Unlock()
	return nil
}

// unhold lets go of the layers a pull held while it ran.
func (s *Store) unhold(rec *record) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range rec.Layers {
		if s.layerRefs[l.DiffID]--; s.layerRefs[l.DiffID] <= 0 {
			delete(s.layerRefs, l.DiffID)
		}
	}
}

// verifiedConfig reads the image config, checked against the manifest's digest of it.
func verifiedConfig(img v1.Image, m *v1.Manifest) (*v1.ConfigFile, error) {
	raw, err := img.RawConfigFile()
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(raw)
	if got := "sha256:" + hex.EncodeToString(sum[:]); got != m.Config.Digest.String() {
		return nil, fmt.Errorf("%w: the config's digest is %s, the manifest says %s", ErrDigest, got, m.Config.Digest)
	}
	cfg, err := v1.ParseConfigFile(strings.NewReader(string(raw)))
	if err != nil {
		return nil, err
	}
	if cfg.OS != "" && cfg.OS != "linux" {
		return nil, fmt.Errorf("the image is for %s, not linux", cfg.OS)
	}
	if want := platform().Architecture; cfg.Architecture != "" && cfg.Architecture != want {
		return nil, fmt.Errorf("the image is for %s, this host runs %s: name the image of its architecture (or a multi-platform reference)", cfg.Architecture, want)
	}
	for _, d := range cfg.RootFS.DiffIDs {
		if !validDiffID(d.String()) {
			return nil, fmt.Errorf("%w: the config lists the diffid %q, not a sha256 digest", ErrDigest, d)
		}
	}
	return cfg, nil
}

// ensureLayer makes the layer diffID with produce (which returns the bytes it charged) unless
// it is in the store (or being made by another pull or snapshot, which it waits for),
// holds it until unhold, and returns the bytes it takes.
func (s *Store) ensureLayer(ctx context.Context, diffID string, produce func() (int64, error)) (int64, error) {
	for {
		s.mu.Lock()
		if n, ok := s.layerBytes[diffID]; ok {
			s.layerRefs[diffID]++ // held until the pull ends, so that GC leaves it
			s.mu.Unlock()
			return n, nil
		}
		ch := s.unpacking[diffID]
		if ch == nil {
			ch = make(chan struct{})
			s.unpacking[diffID] = ch
			s.mu.Unlock()
			n, err := produce()
			s.mu.Lock()
			delete(s.unpacking, diffID)
			if err == nil {
				s.layerBytes[diffID] = n // its charge moves from the unpack to the layer
				s.layerRefs[diffID]++
			}
			s.mu.Unlock()
			close(ch)
			return n, err
		}
		s.mu.Unlock()
		select {
		case <-ch: // then look again: it is there, or this pull tries itself
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// maxTrailer bounds what may follow a layer's end-of-archive marker (tar pads to
// 10 KiB records): a stream that goes on is refused rather than read to its end.
const maxTrailer = 1 << 20

// unpackLayer unpacks l, checks its content against diffID, and moves it into place.
// On an error nothing is left and nothing stays charged.
func (s *Store) unpackLayer(ctx context.Context, diffID string, l v1.Layer) (int64, error) {
	rc, err := l.Uncompressed()
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	u, err := s.unpackStream(ctx, rc)
	if err != nil {
		return 0, err
	}
	if u.diffID != diffID {
		s.discard(u)
		return 0, fmt.Errorf("%w: the layer's content is %s", ErrDigest, u.diffID)
	}
	return s.place(u)
}

// place moves an unpacked layer into its place under its diffid and returns the bytes
// it charged; on an error it is discarded.
func (s *Store) place(u unpacked) (int64, error) {
	// A directory there is one no record names (a previous run's, which GC has not
	// reached yet): nothing uses it.
	err := os.RemoveAll(s.layerDir(u.diffID))
	if err == nil {
		err = os.Rename(u.dir, s.layerDir(u.diffID))
	}
	if err != nil {
		s.discard(u)
		return 0, err
	}
	return u.charged, nil
}

// unpacked is a layer unpacked into a temporary directory of the store.
type unpacked struct {
	dir     string
	diffID  string // the digest of its uncompressed tar stream
	charged int64  // against the store limit
}

// unpackStream unpacks the layer tar r into a temporary directory and flushes it to
// disk. On an error nothing is left and nothing stays charged.
func (s *Store) unpackStream(ctx context.Context, r io.Reader) (unpacked, error) {
	tmp, err := os.MkdirTemp(s.tmpDir(), "layer-")
	if err != nil {
		return unpacked{}, err
	}
	u := unpacked{dir: tmp}
	fail := func(err error) (unpacked, error) {
		s.discard(u)
		return unpacked{}, err
	}
	h := sha256.New()
	in := io.TeeReader(ctxReader{ctx, r}, h)
	charge := func(n int64) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.used+n > s.max {
			return fmt.Errorf("%w: the layers take over SIDECAR_IMAGE_STORE_BYTES=%d", ErrFull, s.max)
		}
		s.used += n
		u.charged += n
		return nil
	}
	if err := unpack(in, tmp, charge); err != nil {
		return fail(err)
	}
	if n, err := io.CopyN(io.Discard, in, maxTrailer+1); err != nil && !errors.Is(err, io.EOF) {
		return fail(err)
	} else if n > maxTrailer {
		return fail(fmt.Errorf("%w: over %d bytes after the end of the layer's archive", ErrRefused, maxTrailer))
	}
	u.diffID = "sha256:" + hex.EncodeToString(h.Sum(nil))
	if err := os.Chmod(tmp, 0o755); err != nil {
		return fail(err)
	}
	// The layer's files reach the disk before its name does: a crash never leaves a
	// layer directory whose content is not what its diffid says.
	if err := syncFS(tmp); err != nil {
		return fail(err)
	}
	return u, nil
}

// discard removes an unpacked directory that did not become a layer, and its charge.
func (s *Store) discard(u unpacked) {
	_ = os.RemoveAll(u.dir) // made by this unpack alone: no mount in it
	s.mu.Lock()
	s.used -= u.charged
	s.mu.Unlock()
}

// syncFS flushes the filesystem dir lies on (one call for the layer's many files).
func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}

// ctxReader stops a pull when the store closes.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
