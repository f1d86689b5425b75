package fsxfer

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// WriteTar streams the tree under dir to w as an uncompressed tar (the caller adds gzip
// when asked), names relative to dir, in name order. Symlinks are stored as links, never
// followed; hard links inside the tree stay hard links. A directory on another mount is
// stored empty, never entered. FIFOs, sockets and devices are left out, and so is a
// hard-linked file that does not belong to the lease uid (it may be a link to a file
// outside). A file that changes size while it is read is cut or zero-padded to the size
// in its header, keeping the archive well formed.
func (f *FS) WriteTar(ctx context.Context, dir string, w io.Writer) error {
	rel, d, err := f.openCleanDir(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	id, err := identify(fd(d))
	if err != nil {
		return wrap("archive", rel, err)
	}
	buf := getBuf()
	defer putBuf(buf)
	tw := tar.NewWriter(w)
	links := map[fileKey]string{}
	err = walk(ctx, fd(d), id.mnt, "", 0, func(e walkEntry) (bool, error) {
		if len(e.rel) > f.cfg.MaxNameBytes {
			return false, ErrNameTooLong
		}
		hdr := &tar.Header{
			Name:    e.rel,
			Mode:    int64(e.st.Mode & 0o7777),
			ModTime: timeOf(e.st),
			Uid:     int(e.st.Uid),
			Gid:     int(e.st.Gid),
		}
		switch e.st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			hdr.Typeflag, hdr.Name = tar.TypeDir, e.rel+"/"
			return !e.mount, tw.WriteHeader(hdr)
		case unix.S_IFLNK:
			target, err := readlinkAt(e.dirfd, e.name)
			if err != nil {
				return false, nil // gone meanwhile
			}
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
			return false, tw.WriteHeader(hdr)
		case unix.S_IFREG:
			return false, f.tarFile(tw, e, hdr, links, *buf)
		}
		return false, nil
	})
	if err != nil {
		return wrap("archive", rel, err)
	}
	return wrap("archive", rel, tw.Close())
}

func (f *FS) tarFile(tw *tar.Writer, e walkEntry, hdr *tar.Header, links map[fileKey]string, buf []byte) error {
	h, err := openFileAt(e.dirfd, e.name)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) {
		return nil // removed or replaced by a symlink meanwhile
	}
	if err != nil {
		return err
	}
	defer h.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(h.Fd()), &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || f.checkServable(&st) != nil {
		return nil
	}
	if st.Nlink > 1 {
		k := keyOf(&st)
		if first, ok := links[k]; ok {
			hdr.Typeflag, hdr.Linkname = tar.TypeLink, first
			return tw.WriteHeader(hdr)
		}
		links[k] = e.rel
	}
	hdr.Typeflag, hdr.Size = tar.TypeReg, st.Size
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	n, err := io.CopyBuffer(tw, io.LimitReader(h, st.Size), buf)
	if err != nil {
		return err
	}
	for n < st.Size { // shrank while read: pad to the announced size
		m, err := tw.Write(zeroBlock[:min(int64(len(zeroBlock)), st.Size-n)])
		if err != nil {
			return err
		}
		n += int64(m)
	}
	return nil
}

// openFileAt opens name in dirfd for reading without following a symlink and without
// blocking on a FIFO.
func openFileAt(dirfd int, name string) (*os.File, error) {
	nfd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(nfd), name), nil
}
