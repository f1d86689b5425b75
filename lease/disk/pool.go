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
// acquire of the default quota renames one instead of running mkfs. Pooled images are
// whole (makeImage renames them in when formatted) and survive restarts; those of another
// size (the default changed) are deleted at startup.
type pool struct {
	q      *Quotas
	dir    string
	size   int64
	target int

	mu     sync.Mutex
	ready  []string
	wake   chan struct{}
	cancel context.CancelFunc
	done   chan struct{}
}

func newPool(q *Quotas, size int64, target int) *pool {
	ctx, cancel := context.WithCancel(context.Background())
	p := &pool{q: q, dir: filepath.Join(q.cfg.ImageDir, "pool"), size: size, target: target,
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
			p.ready = append(p.ready, path)
			continue
		}
		_ = os.Remove(path) // a partial image (.new), another size, or a surplus
	}
}

// take hands out a ready image path ("" when none is) and asks for a new one.
func (p *pool) take() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
	if len(p.ready) == 0 {
		return ""
	}
	img := p.ready[len(p.ready)-1]
	p.ready = p.ready[:len(p.ready)-1]
	return img
}

// fill formats images until target are ready, then waits to be woken by take.
func (p *pool) fill(ctx context.Context) {
	defer close(p.done)
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		p.q.log.Error("disk image pool disabled", "err", err)
		return
	}
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
		if err := makeImage(ctx, p.q.mkfs, img, p.size); err != nil {
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
		p.mu.Lock()
		p.ready = append(p.ready, img)
		p.mu.Unlock()
	}
}

func (p *pool) close() {
	p.cancel()
	<-p.done
}
