package sandbox

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// userFiles are the host files a lease on the host's root has its own of, each bound in
// the lease's mount namespace. A host that replaces one by rename (useradd, groupadd,
// DHCP clients, systemd-resolved) detaches that bind in every namespace. Each lease's
// zygote binds its file again before it forks a launcher, and at once when hostFiles
// sees the rename, so that a long-running server in an idle lease is not left with the
// host's resolv.conf.
var userFiles = []string{"/etc/passwd", "/etc/group", "/etc/resolv.conf"}

// hostFiles watches the directories of userFiles (and of resolv.conf's target, when it is
// a link, as with systemd-resolved) and calls heal after a rename or creation of one of
// them. Renames in a burst (an apt run) are healed together: heal runs again at most once
// for all that came while it ran.
type hostFiles struct {
	f    *os.File // the inotify instance, read through the runtime's poller
	kick chan struct{}
	done sync.WaitGroup
}

func watchHostFiles(heal func(), log *slog.Logger) (*hostFiles, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, err
	}
	h := &hostFiles{f: os.NewFile(uintptr(fd), "inotify"), kick: make(chan struct{}, 1)}
	names := map[int]map[string]bool{} // watch descriptor: the names watched in its directory
	paths := slices.Clone(userFiles)
	if target, err := filepath.EvalSymlinks("/etc/resolv.conf"); err == nil && target != "/etc/resolv.conf" {
		paths = append(paths, target)
	}
	for _, p := range paths {
		wd, err := unix.InotifyAddWatch(fd, filepath.Dir(p), unix.IN_MOVED_TO|unix.IN_CREATE|unix.IN_ONLYDIR)
		if err != nil {
			h.f.Close()
			return nil, &os.PathError{Op: "inotify_add_watch", Path: filepath.Dir(p), Err: err}
		}
		if names[wd] == nil {
			names[wd] = map[string]bool{}
		}
		names[wd][filepath.Base(p)] = true
	}
	h.done.Add(2)
	go func() {
		defer h.done.Done()
		defer close(h.kick)
		h.read(names, log)
	}()
	go func() {
		defer h.done.Done()
		for range h.kick {
			heal()
		}
	}()
	return h, nil
}

// read reads events until the instance is closed, kicking the healer for each that names
// a watched file.
func (h *hostFiles) read(names map[int]map[string]bool, log *slog.Logger) {
	buf := make([]byte, 16<<10)
	for {
		n, err := h.f.Read(buf)
		if err != nil {
			if !errors.Is(err, os.ErrClosed) {
				log.Warn("watching the host's passwd, group and resolv.conf stopped: a lease sees its own again only at its next command", "err", err)
			}
			return
		}
		for b := buf[:n]; len(b) >= unix.SizeofInotifyEvent; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&b[0]))
			end := unix.SizeofInotifyEvent + int(ev.Len)
			if end > len(b) {
				break
			}
			name := bytes.TrimRight(b[unix.SizeofInotifyEvent:end], "\x00")
			if names[int(ev.Wd)][string(name)] || ev.Mask&unix.IN_Q_OVERFLOW != 0 {
				select {
				case h.kick <- struct{}{}:
				default: // a heal is due already
				}
			}
			b = b[end:]
		}
	}
}

// close stops the watch and waits for a heal under way.
func (h *hostFiles) close() {
	h.f.Close()
	h.done.Wait()
}
