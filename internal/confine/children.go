package confine

// Child cgroups are made and removed off the exec path. On cgroup v1 a child is a
// directory in the memory and freezer hierarchies (cgroupv1.go), and making and removing
// a memory cgroup is costly: the kernel sets up and later tears down its per-CPU state and
// walks every filesystem's LRU lists to reparent it. So each cell keeps an empty child
// made ahead, and a finished tree's child, once emptied, is kept for the cell's next tree
// (recycleChild): an agent's commands, one after another, then reuse the same few
// children instead of a mkdir and an rmdir each (under saturating load those and the
// kernel's workers tearing the children down were 12% of the machine's CPU). A child is
// reused only while its counters are those of a fresh one: none of its processes was
// OOM-killed (Tree.OOMKilled reads the child's own count), and nothing else is read per
// child. Only the cell's own trees reuse it: it holds nothing of another lease.

// spareChildren is how many empty child cgroups each cell keeps ready. One covers an
// agent's commands, which come one after another (the next spare is made while the
// command runs); a burst falls back to making children on the exec path. Each spare is a
// memory cgroup, whose kernel state grows with the number of CPUs, for every live cell.
const spareChildren = 1

// keptChildren is how many emptied children a cell keeps among its spares for reuse: one
// for the launcher being made while a command runs and one for the command that just
// ended, so that commands in a row need no new child.
const keptChildren = spareChildren + 1

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

// dropSpares removes the cell's spares (missing ones are fine); the next tree makes one.
func (e *Engine) dropSpares(c *cell) {
	e.mu.Lock()
	spare := c.spare
	c.spare = nil
	e.mu.Unlock()
	for _, name := range spare {
		if err := e.dropChild(c.id, name); err != nil {
			e.log.Warn("remove spare child cgroup", "cell", c.id, "cgroup", name, "err", err)
		}
	}
}

// recycleChild puts a finished tree's child cgroup, which has been emptied (its tree was
// killed: nothing is left in it, and nothing can enter it but what the engine starts
// there), among the cell's spares for its next tree; one whose processes were OOM-killed,
// or one more than keptChildren, is removed instead (dropChild).
func (e *Engine) recycleChild(id, child string) error {
	if e.cg.ChildOOMKills(id, child) > 0 {
		return e.dropChild(id, child)
	}
	e.mu.Lock()
	c := e.live(id)
	keep := c != nil && len(c.spare) < keptChildren
	if keep {
		c.spare = append(c.spare, child)
	}
	e.mu.Unlock()
	if keep {
		return nil
	}
	return e.dropChild(id, child)
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
