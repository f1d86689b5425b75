package fsxfer

import (
	"io/fs"
	"path"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Info describes one directory entry. Type is "file", "dir", "symlink" or "other".
type Info struct {
	Name    string
	Type    string
	Size    int64
	Mode    fs.FileMode // permission bits and the type bits of io/fs
	ModTime time.Time
	Target  string // symlink target
	Nlink   uint64
	UID     int
	GID     int
}

// Stat describes path with Lstat semantics: a symlink as the last element is described,
// not followed. The workdir itself is "" (or ".").
func (f *FS) Stat(p string) (Info, error) {
	rel, err := f.clean(p)
	if err != nil {
		return Info{}, err
	}
	if rel == "." {
		d, err := f.openDir(".")
		if err != nil {
			return Info{}, err
		}
		defer d.Close()
		var st unix.Stat_t
		if err := unix.Fstat(fd(d), &st); err != nil {
			return Info{}, wrap("stat", rel, err)
		}
		return infoFromStat(".", &st, ""), nil
	}
	d, base, err := f.openParent(rel)
	if err != nil {
		return Info{}, err
	}
	defer d.Close()
	return statAt(fd(d), base, rel)
}

func statAt(dirfd int, name, rel string) (Info, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return Info{}, wrap("stat", rel, err)
	}
	target := ""
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		target, _ = readlinkAt(dirfd, name)
	}
	return infoFromStat(name, &st, target), nil
}

// List describes the entries of the directory path, sorted by name. A symlink to a
// directory inside the workdir is listed through; one pointing out is ErrOutside.
func (f *FS) List(p string) ([]Info, error) {
	rel, d, err := f.openCleanDir(p)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	names, err := readNames(fd(d), f.cfg.MaxListEntries)
	if err != nil {
		return nil, wrap("list", rel, err)
	}
	out := make([]Info, 0, len(names))
	for _, name := range names {
		info, err := statAt(fd(d), name, path.Join(rel, name))
		if err != nil {
			continue // removed since it was read
		}
		out = append(out, info)
	}
	slices.SortFunc(out, func(a, b Info) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// readNames reads the names in the directory fd (without "." and ".."), at most max of
// them (ErrTooLarge beyond; max <= 0: no limit).
func readNames(dirfd int, max int) ([]string, error) {
	if _, err := unix.Seek(dirfd, 0, 0); err != nil {
		return nil, err
	}
	buf := make([]byte, 32<<10)
	var names []string
	for {
		n, err := unix.ReadDirent(dirfd, buf)
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return names, nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
		if max > 0 && len(names) > max {
			return nil, ErrTooLarge
		}
	}
}

func readlinkAt(dirfd int, name string) (string, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", err
		}
		if n < len(buf) {
			return string(buf[:n]), nil
		}
		if len(buf) >= 64<<10 {
			return "", ErrNameTooLong
		}
		buf = make([]byte, 2*len(buf))
	}
}

func infoFromStat(name string, st *unix.Stat_t, target string) Info {
	return Info{
		Name:    name,
		Type:    typeName(st.Mode),
		Size:    st.Size,
		Mode:    fileMode(st.Mode),
		ModTime: timeOf(st),
		Target:  target,
		Nlink:   uint64(st.Nlink),
		UID:     int(st.Uid),
		GID:     int(st.Gid),
	}
}

func typeName(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "file"
	case unix.S_IFDIR:
		return "dir"
	case unix.S_IFLNK:
		return "symlink"
	}
	return "other"
}

// fileMode converts st_mode to an fs.FileMode, as os does.
func fileMode(mode uint32) fs.FileMode {
	m := fs.FileMode(mode & 0o777)
	switch mode & unix.S_IFMT {
	case unix.S_IFDIR:
		m |= fs.ModeDir
	case unix.S_IFLNK:
		m |= fs.ModeSymlink
	case unix.S_IFIFO:
		m |= fs.ModeNamedPipe
	case unix.S_IFSOCK:
		m |= fs.ModeSocket
	case unix.S_IFCHR:
		m |= fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFBLK:
		m |= fs.ModeDevice
	}
	if mode&unix.S_ISUID != 0 {
		m |= fs.ModeSetuid
	}
	if mode&unix.S_ISGID != 0 {
		m |= fs.ModeSetgid
	}
	if mode&unix.S_ISVTX != 0 {
		m |= fs.ModeSticky
	}
	return m
}

func timeOf(st *unix.Stat_t) time.Time { return time.Unix(st.Mtim.Unix()) }
