package fsxfer

import (
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// grepCache keeps the contents of small files Grep has read, so that searching the
// same tree again costs one stat per file instead of open, stat, read and close: agents
// grep the same tree over and over, and on this kind of machine the system calls are
// the whole cost (measured: ~8 µs per file read, ~2 µs per stat).
//
// An entry is used only when a stat of the name now (never following it) finds the same
// inode with the same size, mtime and ctime, a regular file of the asking lease's uid.
// Every write changes ctime, which no one can set; and a file is cached only when its
// ctime was at least grepCacheSettle old when it was read, so a write in the same clock
// tick as the read cannot go unnoticed (git's "racy" entries, solved the same way). The
// cache is process-wide (an inode is only ever served to a lease whose uid owns it) and
// bounded by grepCacheBytes.
type grepCache struct {
	mu      sync.Mutex
	entries map[uint64]*cacheEntry // by inode number: a walk knows it from the directory entry, before any stat
	bytes   int64
	hits    int64 // for tests
}

type cacheEntry struct {
	dev          uint64
	size         int64
	mtime, ctime unix.Timespec
	data         []byte
}

const (
	grepCacheBytes    = 64 << 20
	grepCacheMaxFile  = 64 << 10 // larger files gain little (their read dominates the open)
	grepCacheSettle   = 2 * time.Second
	grepCacheOverhead = 128 // bytes counted per entry beyond its data
)

var contentCache = &grepCache{entries: map[uint64]*cacheEntry{}}

// cacheNow is the clock the settle rule reads (tests move it).
var cacheNow = time.Now

// has reports whether an inode may be cached: when not, the stat that would validate
// it is skipped and the file read directly.
func (c *grepCache) has(ino uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.entries[ino] != nil
}

// get returns the cached contents for a file described by st, or nil.
func (c *grepCache) get(st *unix.Stat_t) []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entries[st.Ino]
	if e == nil || e.dev != uint64(st.Dev) || e.size != st.Size || e.mtime != st.Mtim || e.ctime != st.Ctim {
		return nil
	}
	c.hits++
	return e.data
}

// put remembers data as the contents of the file described by st (read at readAt).
func (c *grepCache) put(st *unix.Stat_t, data []byte, readAt time.Time) {
	if st.Size > grepCacheMaxFile || int64(len(data)) != st.Size {
		return
	}
	if readAt.Sub(time.Unix(st.Ctim.Unix())) < grepCacheSettle {
		return // changed too recently to tell a later change by its timestamps
	}
	e := &cacheEntry{dev: uint64(st.Dev), size: st.Size, mtime: st.Mtim, ctime: st.Ctim, data: append([]byte(nil), data...)}
	cost := int64(len(data)) + grepCacheOverhead
	c.mu.Lock()
	defer c.mu.Unlock()
	k := st.Ino
	if old := c.entries[k]; old != nil {
		c.bytes -= int64(len(old.data)) + grepCacheOverhead
	}
	for k2, old := range c.entries { // evict arbitrary entries until it fits
		if c.bytes+cost <= grepCacheBytes {
			break
		}
		delete(c.entries, k2)
		c.bytes -= int64(len(old.data)) + grepCacheOverhead
	}
	c.entries[k] = e
	c.bytes += cost
}
