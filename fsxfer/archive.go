package fsxfer

import (
	"archive/tar"
	"bufio"
	"context"
	"errors"
	"io"

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
	// Headers and small files go out in large writes: one per 256 KiB, not two per file.
	bw := bufio.NewWriterSize(w, tarBufSize)
	tw := tar.NewWriter(bw)
	links := map[fileKey]string{}
	err = walkNoStat(ctx, fd(d), id.mnt, func(e walkEntry) (bool, error) {
		if len(e.rel) > f.cfg.MaxNameBytes {
			return false, ErrNameTooLong
		}
		switch e.typ {
		case unix.S_IFDIR:
			hdr := headerOf(e.rel+"/", e.st)
			hdr.Typeflag = tar.TypeDir
			return !e.mount, tw.WriteHeader(hdr)
		case unix.S_IFLNK:
			target, err := readlinkAt(e.dirfd, e.name)
			if err != nil {
				return false, nil // gone meanwhile
			}
			hdr := headerOf(e.rel, e.st)
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
			return false, tw.WriteHeader(hdr)
		case unix.S_IFREG:
			return false, f.tarFile(tw, e, links, *buf)
		}
		return false, nil
	})
	if err == nil {
		err = tw.Close()
	}
	if err == nil {
		err = bw.Flush() // only a whole archive is flushed: a cut one is never completed
	}
	return wrap("archive", rel, err)
}

// tarBufSize is the write buffer of WriteTar.
const tarBufSize = 256 << 10

func headerOf(name string, st *unix.Stat_t) *tar.Header {
	return &tar.Header{
		Name:    name,
		Mode:    int64(st.Mode & 0o7777),
		ModTime: timeOf(st),
		Uid:     int(st.Uid),
		Gid:     int(st.Gid),
	}
}

// tarFile writes the regular file e, described by a stat of the open descriptor (the
// walk did not stat it), read with bare system calls into buf.
func (f *FS) tarFile(tw *tar.Writer, e walkEntry, links map[fileKey]string, buf []byte) error {
	nfd, err := unix.Openat(e.dirfd, e.name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) {
		return nil // removed or replaced by a symlink meanwhile
	}
	if err != nil {
		return err
	}
	defer unix.Close(nfd)
	var st unix.Stat_t
	if err := unix.Fstat(nfd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || f.checkServable(&st) != nil {
		return nil
	}
	hdr := headerOf(e.rel, &st)
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
	n := int64(0)
	for n < st.Size {
		b, err := readFD(nfd, buf, min(int64(len(buf)), st.Size-n))
		if err != nil {
			return err
		}
		if len(b) == 0 {
			break // shrank while read
		}
		if _, err := tw.Write(b); err != nil {
			return err
		}
		n += int64(len(b))
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
