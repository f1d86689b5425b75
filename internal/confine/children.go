package confine

// Child cgroups are made and removed off the exec path. On cgroup v1 a child is a
// directory in the memory and freezer hierarchies (cgroupv1.go), and removing a used
// memory cgroup makes the kernel walk every filesystem's LRU lists: together a good part of
// what the rest of starting /bin/true costs. So each cell keeps an
// empty child made ahead, and a finished tree's child, once it has been emptied, is
// removed in the background. A spare is never reused: every tree still gets a fresh
// cgroup whose counters (OOM kills, refused forks) are its own.

// spareChildren is how many empty child cgroups each cell keeps ready. One covers an
// agent's commands, which come one after another (the next spare is made while the
// command runs); a burst falls back to making children on the exec path. Each spare is a
// memory cgroup, whose kernel state grows with the number of CPUs, for every live cell.
const spareChildren = 1

// takeChild returns an empty child cgroup of cell id for a new tree, a spare when there
// is one, and tops the spares up in the background.
func (e *Engine) takeChild(id string) (string, error) {
	e.mu.Lock()
	var name string
	if c := e.cells[id]; c != nil {
		if n := len(c.spare); n > 0 {
			name, c.spare = c.spare[n-1], c.spare[:n-1]
		}
		e.refillLocked(c)
	}
	e.mu.Unlock()
	if name != "" {
		return name, nil
	}
	return e.newChild(id)
}

// returnSpare puts an empty, never entered child cgroup among the cell's spares (one just
// made, or one taken for a tree that went elsewhere), or removes it if the cell is being
// removed (Remove waits for the job that made it before it removes the cell).
func (e *Engine) returnSpare(id, name string) {
	e.mu.Lock()
	c := e.live(id)
	if c != nil {
		c.spare = append(c.spare, name)
	}
	e.mu.Unlock()
	if c == nil {
		if err := e.cg.RemoveChild(id, name); err != nil {
			e.log.Warn("remove spare child cgroup", "cell", id, "cgroup", name, "err", err)
		}
	}
}

// refillLocked starts making spares up to spareChildren; e.mu is held. Background work
// is counted in c.jobs only while the cell is live, so Remove and Close, which stop
// that first, can wait for all of it.
func (e *Engine) refillLocked(c *cell) {
	if e.live(c.id) != c {
		return
	}
	for len(c.spare)+c.filling < spareChildren {
		c.filling++
		c.jobs.Go(func() { e.makeSpare(c) })
	}
}

func (e *Engine) makeSpare(c *cell) {
	name, err := e.newChild(c.id)
	e.mu.Lock()
	c.filling--
	gone := e.live(c.id) != c
	e.mu.Unlock()
	if err != nil {
		if !gone { // a cell removed meanwhile needs no spare
			e.log.Warn("spare child cgroup", "cell", c.id, "err", err)
		}
		return
	}
	e.returnSpare(c.id, name)
}

// dropChild removes a finished tree's child cgroup, which has been emptied, keeping its
// OOM kills in the cell's tally (v1 counts them per cgroup): in the background while the
// cell is live, else at once.
func (e *Engine) dropChild(id, child string) error {
	v1 := e.cg.Version() == "v1"
	var oom int64
	if v1 { // v2 counts them in the cell's memory.events too
		oom = e.cg.ChildOOMKills(id, child)
	}
	e.mu.Lock()
	c := e.cells[id]
	if c != nil && v1 {
		c.oomKills += oom
		if c.removing == nil {
			c.removing = map[string]bool{}
		}
		c.removing[child] = true // Usage must not count it twice meanwhile
	}
	async := c != nil && !e.closed
	if async {
		c.jobs.Add(1)
	}
	e.mu.Unlock()
	remove := func() error {
		err := e.cg.RemoveChild(id, child)
		if err == nil && c != nil {
			e.mu.Lock()
			delete(c.removing, child)
			e.mu.Unlock()
		}
		return err
	}
	if !async {
		return remove()
	}
	go func() {
		defer c.jobs.Done()
		if err := remove(); err != nil {
			e.log.Warn("remove child cgroup", "cell", id, "cgroup", child, "err", err)
		}
	}()
	return nil
}
