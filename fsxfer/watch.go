package fsxfer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Watch event types.
const (
	EventCreate   = "create"
	EventWrite    = "write"
	EventRemove   = "remove"
	EventRename   = "rename"
	EventOverflow = "overflow" // events were lost: Dropped of them (0: the kernel's queue overflowed, count unknown)
	EventLimit    = "limit"    // a directory was not watched: MaxDirs reached
	// EventRefused: a directory that appeared was not watched (nor, until one is freed,
	// later ones) because the lease's or the daemon's inotify budget is spent, or the
	// host refused; Reason says which.
	EventRefused = "refused"
)

// WatchEvent is one change below a watched directory. Path (and OldPath of a rename)
// are relative to it.
type WatchEvent struct {
	Type    string
	Path    string
	OldPath string
	Dir     bool
	Dropped int64
	Reason  string // of a refused event
}

// Limits of Watch.
const (
	DefaultWatchDirs  = 1024
	MaxWatchDirs      = 8192
	DefaultWatchQueue = 4096
	MaxWatchQueue     = 65536
	// MaxWatchesPerFS bounds the watches of one lease at once (each is an inotify
	// instance); a small daemon budget lowers it (Budgets.LeaseInotify).
	MaxWatchesPerFS = 8
)

// WatchOptions describe a watch.
type WatchOptions struct {
	Recursive bool
	MaxDirs   int // directories watched at most by this watch; 0: DefaultWatchDirs
	Queue     int // events held for a slow reader; beyond, they are dropped and counted; 0: DefaultWatchQueue
}

// Watcher delivers the changes below one directory of the lease, in the order the
// kernel reports them. It is a bounded queue: a reader that falls behind gets an
// overflow event in place of what was dropped, never unbounded memory. It ends (Next
// returns io.EOF) when closed, when the lease's FS closes, or when the watched
// directory goes away.
type Watcher struct {
	f      *FS
	opts   WatchOptions
	ifd    int
	wake   int // eventfd: Close interrupts the reader's poll
	mnt    uint64
	paths  map[int]string // watch descriptor → directory, relative to the watched one ("" for it)
	root   string         // the watched directory, relative to the workdir
	limitd bool           // a limit event was sent
	// refused: a refused event was sent; reset once a watch is given back, so that the
	// next refusal is reported too.
	refused bool

	mu      sync.Mutex
	queue   []WatchEvent
	dropped int64
	done    bool
	notify  chan struct{}
	exited  chan struct{}
}

// watchMask: what is reported. IN_MODIFY is a write; attribute changes are not
// reported. IN_ONLYDIR refuses anything but a directory.
const watchMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO |
	unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR | unix.IN_EXCL_UNLINK

// Watch starts watching the directory p (and, with Recursive, the directories below it
// that walkTree would enter: never through a symlink, never across a mount, only the
// lease's).
//
// Its inotify instance and every directory it watches are charged to the lease's and
// the daemon's inotify budgets (Budgets): when either cannot hold what the watch needs
// to start, or the host refuses, Watch fails with ErrWatchLimit; a directory that
// appears later and cannot be watched is reported by a refused event.
func (f *FS) Watch(p string, opts WatchOptions) (*Watcher, error) {
	if opts.MaxDirs < 0 || opts.MaxDirs > MaxWatchDirs || opts.Queue < 0 || opts.Queue > MaxWatchQueue {
		return nil, fmt.Errorf("%w: max dirs 0..%d, queue 0..%d", ErrInvalid, MaxWatchDirs, MaxWatchQueue)
	}
	if opts.MaxDirs == 0 {
		opts.MaxDirs = DefaultWatchDirs
	}
	if opts.Queue == 0 {
		opts.Queue = DefaultWatchQueue
	}
	rel, d, err := f.openCleanDir(p)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	if err := f.onWorkdirMount(fd(d)); err != nil {
		return nil, wrap("watch", rel, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd(d), &st); err != nil {
		return nil, wrap("watch", rel, err)
	}
	if rel != "." && int(st.Uid) != f.leaseUID {
		return nil, wrap("watch", rel, ErrForeignLink)
	}
	if err := f.takeInotify(true, 0); err != nil {
		return nil, err
	}
	ifd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		f.giveInotify(1, 0)
		return nil, hostInotifyError(err)
	}
	wake, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		unix.Close(ifd)
		f.giveInotify(1, 0)
		return nil, wrap("watch", rel, err)
	}
	w := &Watcher{f: f, opts: opts, ifd: ifd, wake: wake, mnt: f.mnt, paths: map[int]string{}, root: rel,
		notify: make(chan struct{}, 1), exited: make(chan struct{})}
	if err := f.addWatcher(w); err != nil {
		w.closeFDs()
		return nil, err
	}
	err = w.addDir(fd(d), "")
	if err == nil && opts.Recursive {
		err = w.addTree("", false)
	}
	if err != nil {
		f.removeWatcher(w)
		w.closeFDs()
		return nil, wrap("watch", rel, err)
	}
	go w.read()
	return w, nil
}

// closeFDs closes the watch's descriptors and gives back what it held of the budgets.
func (w *Watcher) closeFDs() {
	unix.Close(w.ifd)
	unix.Close(w.wake)
	w.f.giveInotify(1, len(w.paths))
	w.paths = map[int]string{}
}

// hostInotifyError names the host's refusal of an inotify instance or watch: the
// budgets are set below the host's limits, so this is other users of root's share (or
// limits lowered since the daemon started).
func hostInotifyError(err error) error {
	if errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENOSPC) {
		return fmt.Errorf("%w: the host refused an inotify instance or watch (%v): its fs.inotify.max_user_instances or max_user_watches is reached by root's processes",
			ErrWatchLimit, err)
	}
	return err
}

// addDir watches the open directory dirfd, known as rel, charging it to the budgets.
// The watch is placed through the descriptor's /proc link, so it is the directory
// opened, not whatever a path names by now. Past MaxDirs it sends a limit event and
// returns nil; a budget's (or the host's) refusal is an error wrapping ErrWatchLimit.
func (w *Watcher) addDir(dirfd int, rel string) error {
	if len(w.paths) >= w.opts.MaxDirs {
		if !w.limitd {
			w.limitd = true
			w.push(WatchEvent{Type: EventLimit, Path: rel, Dir: true})
		}
		return nil
	}
	if err := w.f.takeInotify(false, 1); err != nil {
		return err
	}
	wd, err := unix.InotifyAddWatch(w.ifd, "/proc/self/fd/"+strconv.Itoa(dirfd), watchMask)
	if err != nil {
		w.f.giveInotify(0, 1)
		return hostInotifyError(err)
	}
	if _, ok := w.paths[wd]; ok {
		w.f.giveInotify(0, 1) // the same directory again: one watch
	}
	w.paths[wd] = rel
	return nil
}

// addTree watches the directories below rel; with report, what it finds is reported
// as created (it appeared before its directory was watched). It stops at the first
// refusal of a budget (or the host) and returns it.
func (w *Watcher) addTree(rel string, report bool) error {
	start := path.Join(w.root, rel)
	var refused error
	visit := func(e *treeEntry) error {
		crel := path.Join(rel, e.rel)
		isDir := e.mode == unix.S_IFDIR
		if report {
			w.push(WatchEvent{Type: EventCreate, Path: crel, Dir: isDir})
		}
		if isDir && !e.mount && refused == nil {
			child, err := openDirAt(e.dir.fd, e.name, w.mnt)
			if err == nil {
				refused = w.addDir(child, crel)
				unix.Close(child)
			}
			if refused != nil && !report {
				return errStopWalk
			}
			if refused != nil {
				w.refuse(crel, refused)
			}
		}
		return nil
	}
	_ = w.f.walkTree(context.Background(), start, TreeOptions{Hidden: true}, visit, nil)
	return refused
}

// refuse reports a directory the budgets (or the host) refused to watch, once until a
// watch is given back.
func (w *Watcher) refuse(rel string, err error) {
	if w.refused {
		return
	}
	w.refused = true
	w.push(WatchEvent{Type: EventRefused, Path: rel, Dir: true, Reason: err.Error()})
}

// openSub opens the directory rel (below the watched one) without following its last
// element and without crossing a mount.
func (w *Watcher) openSub(rel string) (int, error) {
	d, base, err := w.f.openParent(path.Join(w.root, rel))
	if err != nil {
		return -1, err
	}
	defer d.Close()
	var st unix.Stat_t
	if err := unix.Fstatat(fd(d), base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return -1, err
	}
	if int(st.Uid) != w.f.leaseUID {
		return -1, ErrNotRegular
	}
	return openDirAt(fd(d), base, w.mnt)
}

// push queues an event, or counts it as dropped when the queue is full. Once room
// comes back, an overflow event stands where the lost events were.
func (w *Watcher) push(e WatchEvent) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.dropped > 0 {
		if len(w.queue) >= w.opts.Queue {
			w.dropped++
			return
		}
		w.queue = append(w.queue, WatchEvent{Type: EventOverflow, Dropped: w.dropped})
		w.dropped = 0
	}
	if len(w.queue) >= w.opts.Queue {
		w.dropped++
		return
	}
	w.queue = append(w.queue, e)
	select {
	case w.notify <- struct{}{}:
	default:
	}
}

// Next returns the next event, waiting for one; io.EOF once the watch has ended and
// its queue is drained.
func (w *Watcher) Next(ctx context.Context) (WatchEvent, error) {
	for {
		w.mu.Lock()
		if len(w.queue) > 0 {
			e := w.queue[0]
			w.queue[0] = WatchEvent{}
			w.queue = w.queue[1:]
			if len(w.queue) == 0 {
				w.queue = nil // let the backing array go
			}
			w.mu.Unlock()
			return e, nil
		}
		if w.dropped > 0 {
			e := WatchEvent{Type: EventOverflow, Dropped: w.dropped}
			w.dropped = 0
			w.mu.Unlock()
			return e, nil
		}
		done := w.done
		w.mu.Unlock()
		if done {
			return WatchEvent{}, io.EOF
		}
		select {
		case <-w.notify:
		case <-w.exited:
		case <-ctx.Done():
			return WatchEvent{}, ctx.Err()
		}
	}
}

// Close ends the watch and releases its inotify instance.
func (w *Watcher) Close() error {
	w.mu.Lock()
	if !w.done { // after done the descriptor is closed (and its number maybe reused)
		var one [8]byte
		one[0] = 1
		_, _ = unix.Write(w.wake, one[:])
	}
	w.mu.Unlock()
	<-w.exited
	return nil
}

// read is the watch's one goroutine: it turns inotify records into events.
func (w *Watcher) read() {
	defer func() {
		w.f.removeWatcher(w)
		w.mu.Lock()
		w.done = true
		w.closeFDs()
		w.mu.Unlock()
		close(w.exited)
	}()
	buf := make([]byte, 64<<10)
	var pending *WatchEvent // a move-from waiting for its move-to
	var cookie uint32
	flush := func() {
		if pending != nil {
			w.push(*pending) // moved out of the watched tree: gone from here
			if pending.Dir {
				w.forget(pending.Path)
			}
			pending = nil
		}
	}
	fds := []unix.PollFd{{Fd: int32(w.ifd), Events: unix.POLLIN}, {Fd: int32(w.wake), Events: unix.POLLIN}}
	for {
		timeout := -1
		if pending != nil {
			timeout = 10 // a move-to follows its move-from at once, or never
		}
		n, err := unix.Poll(fds, timeout)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || fds[1].Revents != 0 {
			return
		}
		if n == 0 {
			flush()
			continue
		}
		nr, err := unix.Read(w.ifd, buf)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || nr <= 0 {
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= nr; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := ""
			if ev.Len > 0 {
				raw := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
				name = strings.TrimRight(string(raw), "\x00")
			}
			off += unix.SizeofInotifyEvent + int(ev.Len)
			if ev.Mask&unix.IN_Q_OVERFLOW != 0 {
				flush()
				w.push(WatchEvent{Type: EventOverflow})
				continue
			}
			dir, ok := w.paths[int(ev.Wd)]
			if ev.Mask&unix.IN_IGNORED != 0 {
				if ok {
					delete(w.paths, int(ev.Wd))
					w.f.giveInotify(0, 1)
					w.refused = false
				}
				if ok && dir == "" {
					flush()
					return // the watched directory itself is gone
				}
				continue
			}
			if !ok || ev.Mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF) != 0 {
				continue // reported by its parent
			}
			rel := path.Join(dir, name)
			isDir := ev.Mask&unix.IN_ISDIR != 0
			if pending != nil && !(ev.Mask&unix.IN_MOVED_TO != 0 && ev.Cookie == cookie) {
				flush()
			}
			switch {
			case ev.Mask&unix.IN_CREATE != 0:
				w.push(WatchEvent{Type: EventCreate, Path: rel, Dir: isDir})
				if isDir && w.opts.Recursive {
					w.watchNew(rel)
				}
			case ev.Mask&unix.IN_MODIFY != 0:
				w.push(WatchEvent{Type: EventWrite, Path: rel})
			case ev.Mask&unix.IN_DELETE != 0:
				w.push(WatchEvent{Type: EventRemove, Path: rel, Dir: isDir})
			case ev.Mask&unix.IN_MOVED_FROM != 0:
				pending, cookie = &WatchEvent{Type: EventRemove, Path: rel, Dir: isDir}, ev.Cookie
			case ev.Mask&unix.IN_MOVED_TO != 0:
				if pending != nil {
					w.push(WatchEvent{Type: EventRename, Path: rel, OldPath: pending.Path, Dir: isDir})
					if isDir {
						w.renamed(pending.Path, rel)
					}
					pending = nil
				} else {
					w.push(WatchEvent{Type: EventCreate, Path: rel, Dir: isDir})
					if isDir && w.opts.Recursive {
						w.watchNew(rel)
					}
				}
			}
		}
	}
}

// watchNew watches a directory that appeared, and what appeared in it before it was
// watched is reported as created (an entry may so be reported twice, never missed).
func (w *Watcher) watchNew(rel string) {
	dfd, err := w.openSub(rel)
	if err != nil {
		return
	}
	err = w.addDir(dfd, rel)
	unix.Close(dfd)
	if err != nil {
		w.refuse(rel, err)
	}
	_ = w.addTree(rel, true) // reports what it holds even when it cannot be watched
}

// renamed moves the paths of the watched directories at or below from to to.
func (w *Watcher) renamed(from, to string) {
	for wd, p := range w.paths {
		if p == from {
			w.paths[wd] = to
		} else if rest, ok := strings.CutPrefix(p, from+"/"); ok {
			w.paths[wd] = to + "/" + rest
		}
	}
}

// forget drops the watches of a directory that left the watched tree.
func (w *Watcher) forget(rel string) {
	for wd, p := range w.paths {
		if p == rel || strings.HasPrefix(p, rel+"/") {
			_, _ = unix.InotifyRmWatch(w.ifd, uint32(wd))
			delete(w.paths, wd) // its IN_IGNORED, when it comes, finds it gone
			w.f.giveInotify(0, 1)
			w.refused = false
		}
	}
}

// The FS keeps its watchers so that closing it (the lease's end) ends them.
type watcherSet struct {
	mu     sync.Mutex
	set    map[*Watcher]struct{}
	closed bool
}

func (f *FS) addWatcher(w *Watcher) error {
	s := &f.watchers
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("%w: the lease's file area is closed", ErrNotFound)
	}
	if s.set == nil {
		s.set = map[*Watcher]struct{}{}
	}
	s.set[w] = struct{}{}
	return nil
}

func (f *FS) removeWatcher(w *Watcher) {
	f.watchers.mu.Lock()
	delete(f.watchers.set, w)
	f.watchers.mu.Unlock()
}

// closeWatchers ends every watch of the FS and waits for them.
func (f *FS) closeWatchers() {
	s := &f.watchers
	s.mu.Lock()
	s.closed = true
	ws := make([]*Watcher, 0, len(s.set))
	for w := range s.set {
		ws = append(ws, w)
	}
	s.mu.Unlock()
	for _, w := range ws {
		_ = w.Close()
	}
}
