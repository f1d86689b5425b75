package confine

// A tree's leftovers are the processes still in its child cgroup once its main process
// has exited and the tree is closed: `server &` from a shell that then returns, a
// double-forked daemon. They stay in that child cgroup, inside the cell's, so the cell's
// memory, cpu and pids limits still bind them; Remove kills them with the rest of the
// cell. A child cgroup that has emptied is removed by PruneLeftovers.

// keepLeftovers records child as holding leftovers when it still has processes, and
// reports whether it did. A cell removed meanwhile keeps nothing.
func (e *Engine) keepLeftovers(id, child string) bool {
	pids, err := e.cg.ChildPids(id, child)
	if err != nil || len(pids) == 0 {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	c := e.cells[id]
	if c == nil {
		return false
	}
	if c.leftovers == nil {
		c.leftovers = map[string]bool{}
	}
	c.leftovers[child] = true
	return true
}

// LeftoverPids prunes the cell's emptied leftover cgroups and returns the pids of the
// others.
func (e *Engine) LeftoverPids(id string) []int {
	e.mu.Lock()
	c := e.cells[id]
	e.mu.Unlock()
	if c == nil {
		return nil
	}
	var pids []int
	for _, p := range e.prune(c) {
		pids = append(pids, p...)
	}
	return pids
}

// PruneLeftovers removes the emptied leftover cgroups of cell id, or of every cell for
// "" (the daemon's periodic reaper, so a long lease does not pile up empty cgroups).
func (e *Engine) PruneLeftovers(id string) {
	e.mu.Lock()
	var cells []*cell
	for _, c := range e.cells {
		if (id == "" || c.id == id) && len(c.leftovers) > 0 {
			cells = append(cells, c)
		}
	}
	e.mu.Unlock()
	for _, c := range cells {
		e.prune(c)
	}
}

// prune drops the cell's leftover cgroups that have emptied and returns the pids of the
// others, by child cgroup.
func (e *Engine) prune(c *cell) map[string][]int {
	e.mu.Lock()
	names := make([]string, 0, len(c.leftovers))
	for name := range c.leftovers {
		names = append(names, name)
	}
	e.mu.Unlock()
	held := map[string][]int{}
	for _, name := range names {
		pids, err := e.cg.ChildPids(c.id, name)
		if err != nil || len(pids) > 0 {
			held[name] = pids
			continue
		}
		// Empty: nothing can enter it again. It is removed here and now, and forgotten only
		// once removed: a cgroup whose last process is a zombie not yet reaped may still
		// refuse (v2 counts it populated until then), and the next prune tries again.
		e.mu.Lock()
		live := e.cells[c.id] == c && c.leftovers[name]
		e.mu.Unlock()
		if !live {
			continue
		}
		oom := e.cg.ChildOOMKills(c.id, name)
		if err := e.cg.RemoveChild(c.id, name); err != nil {
			e.log.Debug("emptied leftover cgroup not removable yet", "cell", c.id, "cgroup", name, "err", err)
			held[name] = nil
			continue
		}
		e.mu.Lock()
		delete(c.leftovers, name)
		if e.cg.Version() == "v1" {
			c.oomKills += oom // v1 counts OOM kills per cgroup: the cell's tally keeps them
		}
		e.mu.Unlock()
	}
	return held
}
