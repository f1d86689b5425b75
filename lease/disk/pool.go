package disk

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// pool keeps formatted images of the default size ready in ImageDir/pool, so that an
// acquire of the default quota renames one instead of running mkfs. Each is also mounted
// ahead, detached (mountDetached), so the acquire only moves the mount onto the lease's
// directory; where the kernel refuses that, images wait unmounted. Pooled images are
// whole (makeImage renames them in when formatted) and survive restarts, unmounted (a
// detached mount goes with its process); those of another size (the default changed) are
// deleted at startup.
type pool struct {
	q      *Quotas
	dir    string
	size   int64
	target int

	mu       sync.Mutex
	ready    []pooled
	premount bool // mount images ahead; off after the first failure, which is logged
	wake     chan struct{}
	cancel   context.CancelFunc
	done     chan struct{}
}

// pooled is a ready image and, when mounted ahead, its detached filesystem.
type pooled struct {
	path string
	mnt  *os.File // nil: not mounted
}

func newPool(q *Quotas, size int64, target int) *pool {
	ctx, cancel := context.WithCancel(context.Background())
	p := &pool{q: q, dir: filepath.Join(q.cfg.ImageDir, "pool"), size: size, target: target, premount: true,
		wake: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{})}
	p.adopt()
	go p.fill(ctx)
	return p
}

// adopt takes the images a previous run left in the pool, when they have the right size.
func (p *pool) adopt() {
	entries, _ := os.ReadDir(p.dir)
	for _, de := range entries {
		path := filepath.Join(p.dir, de.Name())
		fi, err := de.Info()
		if err == nil && de.Type().IsRegular() && strings.HasSuffix(de.Name(), ".img") && fi.Size() == p.size && len(p.ready) < p.target {
			p.ready = append(p.ready, pooled{path: path})
			continue
		}
		_ = os.Remove(path) // a partial image (.new), another size, or a surplus
	}
}

// take hands out a ready image (path "" when none is) and asks for a new one.
func (p *pool) take() pooled {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
	if len(p.ready) == 0 {
		return pooled{}
	}
	img := p.ready[len(p.ready)-1]
	p.ready = p.ready[:len(p.ready)-1]
	return img
}

// fill mounts the adopted images, then formats and mounts images until target are ready,
// then waits to be woken by take.
func (p *pool) fill(ctx context.Context) {
	defer close(p.done)
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		p.q.log.Error("disk image pool disabled", "err", err)
		return
	}
	p.mountAdopted()
	for n := 0; ; {
		p.mu.Lock()
		short := len(p.ready) < p.target
		p.mu.Unlock()
		if !short {
			select {
			case <-ctx.Done():
				return
			case <-p.wake:
				continue
			}
		}
		n++
		img := filepath.Join(p.dir, fmt.Sprintf("%d-%d.img", time.Now().UnixNano(), n))
		if err := p.q.tpl.format(ctx, img, p.size); err != nil {
			if ctx.Err() != nil {
				return
			}
			// Acquires make their own meanwhile; try again on the next take.
			p.q.log.Warn("cannot make a pooled disk image", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-p.wake:
			}
			continue
		}
		mnt := p.mount(img)
		p.mu.Lock()
		p.ready = append(p.ready, pooled{path: img, mnt: mnt})
		p.mu.Unlock()
	}
}

// mountAdopted mounts ahead the images a previous run left, one at a time (taken out of the
// pool meanwhile, so no acquire gets one half mounted). One that a loop device still
// holds (the previous run's filesystem going away) stays unmounted: a second device on it
// would be a second ext4 instance on one image; Attach mounts it through that device.
func (p *pool) mountAdopted() {
	p.mu.Lock()
	adopted := p.ready
	p.ready = nil
	p.mu.Unlock()
	for _, r := range adopted {
		if devs, err := loopsOf(r.path); err == nil && len(devs) == 0 {
			r.mnt = p.mount(r.path)
		}
		p.mu.Lock()
		p.ready = append(p.ready, r)
		p.mu.Unlock()
	}
}

// mount mounts img ahead, or returns nil once that has failed (logged the first time).
func (p *pool) mount(img string) *os.File {
	p.mu.Lock()
	on := p.premount
	p.mu.Unlock()
	if !on {
		return nil
	}
	mnt, err := mountDetached(img)
	if err != nil {
		p.mu.Lock()
		p.premount = false
		p.mu.Unlock()
		p.q.log.Info("pooled disk images are not mounted ahead: each acquire mounts its own", "err", err)
		return nil
	}
	return mnt
}

// close stops the filler and lets go of the mounted-ahead filesystems; their images stay.
func (p *pool) close() {
	p.cancel()
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range p.ready {
		if p.ready[i].mnt != nil {
			_ = p.ready[i].mnt.Close()
			p.ready[i].mnt = nil
		}
	}
}
