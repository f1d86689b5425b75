package lease

import "fmt"

// uidPool hands out uids from [first, last] round-robin, so a uid just freed (whose stray
// IPC objects or /dev/shm files may linger a moment) is the last to be handed out again.
// The zero pool (first == 0) hands out 0: no per-lease uid. Not safe for concurrent use.
type uidPool struct {
	first, last, next int
	used              map[int]bool
}

func newUIDPool(first, last int) uidPool {
	return uidPool{first: first, last: last, next: first, used: map[int]bool{}}
}

func (p *uidPool) take() (int, error) {
	if p.first == 0 {
		return 0, nil
	}
	n := p.last - p.first + 1
	for i := range n {
		uid := p.first + (p.next-p.first+i)%n
		if !p.used[uid] {
			p.used[uid] = true
			p.next = uid + 1
			if p.next > p.last {
				p.next = p.first
			}
			return uid, nil
		}
	}
	return 0, fmt.Errorf("%w: all %d uids of %d-%d are in use", ErrLimit, n, p.first, p.last)
}

// mark records a uid in use, as found in the state file.
func (p *uidPool) mark(uid int) {
	if uid != 0 {
		p.used[uid] = true
	}
}

func (p *uidPool) free(uid int) { delete(p.used, uid) }
