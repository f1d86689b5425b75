package disk

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"
)

// maxTemplates bounds the sizes kept formatted; the least recently used goes first.
const maxTemplates = 8

// templateArgs are tried in order until mkfs accepts one.
var templateArgs = [][]string{
	mkfsArgs(",metadata_csum,metadata_csum_seed", ",assume_storage_prezeroed=1"),
	mkfsArgs(",metadata_csum,metadata_csum_seed", ""),
}

// templates formats images by cloning: mkfs runs once per size, into a template, and
// each image of that size is a sparse copy of it with a UUID of its own. A clone copies
// the ~150 KiB mkfs wrote and patches the superblocks, where mkfs costs a fork and exec
// and, before formatting, reads the whole mount table and asks every loop device what
// it holds (its "is it mounted" check): with one mount and one loop device per lease,
// that grew with the leases held.
//
// Only the UUID may differ between two images of a size, so templates are made with
// metadata_csum_seed: every metadata checksum is seeded from a field the clone keeps,
// and only each superblock's own checksum is computed again. Where the template cannot
// be made or read that way (e2fsprogs before 1.43), format runs mkfs per image instead.
//
// Templates are also made with assume_storage_prezeroed (e2fsprogs 1.47), tried first:
// an image starts as a hole, which reads as zeros, so its inode tables are marked zeroed
// and the kernel's ext4lazyinit thread has nothing to write after each mount (measured:
// 4% of all CPU while 1,000 leases were acquired).
type templates struct {
	mkfs string
	dir  string
	log  *slog.Logger

	mu     sync.Mutex
	bySize map[int64]*template
	clock  uint64
	args   [][]string // what is left of templateArgs to try: the first worked last time
	off    error      // set when a template could not be made: every image gets its own mkfs
}

// template is a formatted image and where its superblock and backups are.
type template struct {
	path   string
	supers []superblock
	used   uint64
}

// superblock is one copy of the ext4 superblock in a template: its byte offset and bytes.
type superblock struct {
	at   int64
	data []byte
}

// ext4 superblock layout (struct ext4_super_block).
const (
	sbSize          = 1024
	sbPrimary       = 1024 // byte offset of the primary superblock
	sbBlocksLo      = 0x04
	sbFirstData     = 0x14
	sbLogBlock      = 0x18
	sbBlocksPerGrp  = 0x20
	sbMagic         = 0x38
	sbFeatCompat    = 0x5C
	sbFeatIncompat  = 0x60
	sbFeatRoCompat  = 0x64
	sbUUID          = 0x68
	sbBackupBGs     = 0x24C
	sbBlocksHi      = 0x150
	sbChecksum      = 0x3FC
	ext4Magic       = 0xEF53
	compatSparse2   = 0x200
	incompat64bit   = 0x80
	incompatCsumSd  = 0x2000
	roCompatSparse  = 0x1
	roCompatMetaCsm = 0x400
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// newTemplates keeps templates in dir, which it empties: a template of an earlier run may
// have been made with other options.
func newTemplates(mkfs, dir string, log *slog.Logger) *templates {
	if entries, err := os.ReadDir(dir); err == nil {
		for _, de := range entries {
			if de.Type().IsRegular() {
				_ = os.Remove(filepath.Join(dir, de.Name()))
			}
		}
	}
	return &templates{mkfs: mkfs, dir: dir, log: log, bySize: map[int64]*template{}, args: templateArgs}
}

// format makes img, a formatted image of size bytes: a clone of the size's template, or
// with mkfs where templates are off. Like makeImage, img is either absent or whole.
func (t *templates) format(ctx context.Context, img string, bytes int64) error {
	tpl, src, err := t.open(ctx, bytes)
	if err != nil {
		return err
	}
	if src == nil {
		return makeImage(ctx, t.mkfs, img, bytes, nil)
	}
	defer src.Close()
	if err := cloneImage(src, tpl.supers, img, bytes); err != nil {
		return fmt.Errorf("disk: make image %s: %w", filepath.Base(img), err)
	}
	return nil
}

// open returns the template of size bytes, open, making it first when there is none; a
// nil file when templates are off. The open file outlives an eviction that removes it.
func (t *templates) open(ctx context.Context, bytes int64) (*template, *os.File, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.off != nil {
		return nil, nil, nil
	}
	tpl := t.bySize[bytes]
	if tpl == nil {
		var err error
		if tpl, err = t.make(ctx, bytes); err != nil {
			if ctx.Err() != nil {
				return nil, nil, err
			}
			t.off = err
			t.log.Warn("disk images are formatted one by one with mkfs, not cloned from a template", "err", err)
			return nil, nil, nil
		}
		t.evict()
		t.bySize[bytes] = tpl
	}
	t.clock++
	tpl.used = t.clock
	f, err := os.Open(tpl.path)
	if err != nil {
		return nil, nil, fmt.Errorf("disk: template: %w", err)
	}
	return tpl, f, nil
}

// evict removes the least recently used template when the cache is full.
func (t *templates) evict() {
	if len(t.bySize) < maxTemplates {
		return
	}
	var oldest int64 = -1
	for size, tpl := range t.bySize {
		if oldest < 0 || tpl.used < t.bySize[oldest].used {
			oldest = size
		}
	}
	_ = os.Remove(t.bySize[oldest].path)
	delete(t.bySize, oldest)
}

// make formats a template of size bytes and finds its superblocks.
func (t *templates) make(ctx context.Context, bytes int64) (*template, error) {
	if err := os.MkdirAll(t.dir, 0o700); err != nil {
		return nil, fmt.Errorf("disk: template dir: %w", err)
	}
	path := filepath.Join(t.dir, fmt.Sprintf("%d.img", bytes))
	err := errors.New("mkfs took none of the template options")
	for len(t.args) > 0 {
		if err = makeImage(ctx, t.mkfs, path, bytes, t.args[0]); err == nil || ctx.Err() != nil {
			break
		}
		t.args = t.args[1:]
	}
	if err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("disk: template: %w", err)
	}
	defer f.Close()
	supers, err := readSuperblocks(f)
	if err != nil {
		_ = os.Remove(path)
		return nil, fmt.Errorf("disk: template of %d bytes: %w", bytes, err)
	}
	return &template{path: path, supers: supers}, nil
}

// readSuperblocks reads the primary superblock and its backups, and checks that a clone
// needs nothing else changed: metadata checksums seeded apart from the UUID, and each
// superblock's checksum computed as this code computes it.
func readSuperblocks(f io.ReaderAt) ([]superblock, error) {
	primary := make([]byte, sbSize)
	if _, err := f.ReadAt(primary, sbPrimary); err != nil {
		return nil, err
	}
	le := binary.LittleEndian
	if le.Uint16(primary[sbMagic:]) != ext4Magic {
		return nil, errors.New("no ext4 superblock")
	}
	incompat, roCompat := le.Uint32(primary[sbFeatIncompat:]), le.Uint32(primary[sbFeatRoCompat:])
	if roCompat&roCompatMetaCsm == 0 || incompat&incompatCsumSd == 0 {
		return nil, errors.New("made without metadata_csum and metadata_csum_seed (e2fsprogs 1.43 or later has them)")
	}
	if le.Uint32(primary[sbChecksum:]) != superblockChecksum(primary) {
		return nil, errors.New("superblock checksum is not crc32c as expected")
	}
	blocks := int64(le.Uint32(primary[sbBlocksLo:]))
	if incompat&incompat64bit != 0 {
		blocks |= int64(le.Uint32(primary[sbBlocksHi:])) << 32
	}
	blockSize := int64(1024) << le.Uint32(primary[sbLogBlock:])
	first, perGroup := int64(le.Uint32(primary[sbFirstData:])), int64(le.Uint32(primary[sbBlocksPerGrp:]))
	if perGroup == 0 {
		return nil, errors.New("no blocks per group")
	}
	backups := func(g int64) bool { return true } // no sparse_super: every group
	switch {
	case le.Uint32(primary[sbFeatCompat:])&compatSparse2 != 0:
		a, b := int64(le.Uint32(primary[sbBackupBGs:])), int64(le.Uint32(primary[sbBackupBGs+4:]))
		backups = func(g int64) bool { return g == a || g == b }
	case roCompat&roCompatSparse != 0:
		backups = func(g int64) bool { return g == 1 || powerOf(g, 3) || powerOf(g, 5) || powerOf(g, 7) }
	}
	supers := []superblock{{at: sbPrimary, data: primary}}
	for g := int64(1); first+g*perGroup < blocks; g++ {
		if !backups(g) {
			continue
		}
		at := (first + g*perGroup) * blockSize
		b := make([]byte, sbSize)
		if _, err := f.ReadAt(b, at); err != nil {
			return nil, fmt.Errorf("backup superblock of group %d: %w", g, err)
		}
		if le.Uint16(b[sbMagic:]) != ext4Magic || string(b[sbUUID:sbUUID+16]) != string(primary[sbUUID:sbUUID+16]) {
			return nil, fmt.Errorf("no backup superblock in group %d where expected", g)
		}
		supers = append(supers, superblock{at: at, data: b})
	}
	return supers, nil
}

func powerOf(g, base int64) bool {
	for g > 1 && g%base == 0 {
		g /= base
	}
	return g == 1
}

// superblockChecksum is ext4's: crc32c seeded with ~0, not inverted at the end, over all
// but the checksum field.
func superblockChecksum(sb []byte) uint32 {
	return ^crc32.Checksum(sb[:sbChecksum], castagnoli)
}

// cloneImage copies the template src (its data extents; holes stay holes) to img with a
// random UUID written into each superblock. It writes under a temporary name, syncs and
// renames, so img is either absent or whole.
func cloneImage(src *os.File, supers []superblock, img string, bytes int64) (err error) {
	tmp := img + ".new"
	dst, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := dst.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Rename(tmp, img)
		}
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()
	if err := dst.Truncate(bytes); err != nil {
		return err
	}
	if err := copyExtents(src, dst, bytes); err != nil {
		return err
	}
	var uuid [16]byte
	if _, err := rand.Read(uuid[:]); err != nil {
		return err
	}
	uuid[6] = uuid[6]&0x0f | 0x40 // version 4, variant 10: what mkfs makes
	uuid[8] = uuid[8]&0x3f | 0x80
	for _, sb := range supers {
		b := append([]byte(nil), sb.data...)
		copy(b[sbUUID:], uuid[:])
		binary.LittleEndian.PutUint32(b[sbChecksum:], superblockChecksum(b))
		if _, err := dst.WriteAt(b, sb.at); err != nil {
			return err
		}
	}
	return dst.Sync()
}

// copyExtents copies what src holds in [0, size) to the same offsets of dst, skipping
// holes: copy_file_range where the filesystem has it (a reflink on XFS and btrfs),
// plain reads and writes where it refuses.
func copyExtents(src, dst *os.File, size int64) error {
	sfd := int(src.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(sfd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) { // no data after off
			return nil
		}
		if err != nil {
			return fmt.Errorf("seek data: %w", err)
		}
		hole, err := unix.Seek(sfd, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole: %w", err)
		}
		hole = min(hole, size)
		if err := copyRange(src, dst, data, hole-data); err != nil {
			return err
		}
		off = hole
	}
	return nil
}

// copyRange copies n bytes at off from src to dst.
func copyRange(src, dst *os.File, off, n int64) error {
	for roff, woff := off, off; n > 0; {
		c, err := unix.CopyFileRange(int(src.Fd()), &roff, int(dst.Fd()), &woff, int(n), 0)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL) {
				_, err = io.Copy(io.NewOffsetWriter(dst, woff), io.NewSectionReader(src, roff, n))
			}
			if err != nil {
				return fmt.Errorf("copy: %w", err)
			}
			return nil
		}
		if c == 0 {
			return io.ErrUnexpectedEOF
		}
		n -= int64(c)
	}
	return nil
}
