package fsxfer

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// dirID identifies a directory: the mount it is on and its inode. Two descriptors with
// the same dirID refer to the same directory; a different mount ID means a mount point
// was crossed (st_dev alone misses a bind mount of the same filesystem).
type dirID struct {
	mnt uint64
	dev uint64
	ino uint64
}

func identify(fd int) (dirID, error) {
	var stx unix.Statx_t
	err := unix.Statx(fd, "", unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW, unix.STATX_INO|unix.STATX_MNT_ID, &stx)
	if err != nil {
		return dirID{}, err
	}
	return dirID{
		mnt: stx.Mnt_id,
		dev: unix.Mkdev(stx.Dev_major, stx.Dev_minor),
		ino: stx.Ino,
	}, nil
}

// mountsUnder reports the mount points at or below the absolute path dir, read from
// /proc/thread-self/mountinfo: the calling thread's mount namespace, where removal acts
// (/proc/self is the main thread's, which may have been left in another namespace).
func mountsUnder(dir string) ([]string, error) {
	f, err := os.Open("/proc/thread-self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	dir = filepath.Clean(dir)
	var found []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMountPath(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") || dir == "/" {
			found = append(found, mp)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	return found, nil
}

// unescapeMountPath undoes the kernel's octal escapes (\040 for a space and so on).
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
