package fsxfer

import (
	"io"
	"os"
	"path"

	"golang.org/x/sys/unix"
)

// File is an open regular file of the lease, for reading.
type File interface {
	io.ReadSeekCloser
	Info() Info
	// SHA256 is the digest recorded when the daemon wrote the file, if the file has not
	// changed since; nil otherwise (the caller hashes it).
	SHA256() []byte
}

func (f *file) SHA256() []byte { return cachedDigest(f.File) }

type file struct {
	*os.File
	info Info
}

func (f *file) Info() Info { return f.info }

// Open opens the regular file at path for reading. Symlinks are followed inside the
// workdir only (one pointing out is ErrOutside). The open never blocks: it is
// non-blocking, and anything but a regular file is refused after fstat (ErrIsDir for a
// directory, ErrNotRegular for FIFOs, devices and sockets). A file with more than one
// hard link is served only when it belongs to the lease uid (ErrForeignLink): it may be a
// link to a file outside the workdir.
func (f *FS) Open(p string) (File, error) {
	rel, err := f.clean(p)
	if err != nil {
		return nil, err
	}
	h, err := f.root.OpenFile(rel, os.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, wrap("open", rel, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(h.Fd()), &st); err != nil {
		h.Close()
		return nil, wrap("open", rel, err)
	}
	if err := f.checkServable(&st); err != nil {
		h.Close()
		return nil, wrap("open", rel, err)
	}
	return &file{File: h, info: infoFromStat(path.Base(rel), &st, "")}, nil
}

// checkServable refuses what must not be read or replaced through the API.
func (f *FS) checkServable(st *unix.Stat_t) error {
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
	case unix.S_IFDIR:
		return ErrIsDir
	default:
		return ErrNotRegular
	}
	if st.Nlink > 1 && int(st.Uid) != f.leaseUID {
		return ErrForeignLink
	}
	return nil
}
