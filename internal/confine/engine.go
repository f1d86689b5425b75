package confine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"strconv"
	"sync"
)

// Engine starts confined process trees (Command) and keeps the cells under the daemon's
// cgroup parent: the child cgroups of their trees (spares made ahead, emptied ones kept
// for the next tree or removed behind, the ones that still hold leftovers, the OOM kills
// of those removed) and their launchers. It is safe for concurrent use.
type Engine struct {
	cg        Cgroups // nil: no cgroups, trees are process groups
	log       *slog.Logger
	helper    string
	helperArg string
	coldStart bool
	forks     bool          // the helper is the C one: a zygote (zygote.go), Start.MountNS
	spawner   *spawner      // starts helpers without streams (spawner.go); nil: the daemon does
	launching chan struct{} // a slot per launcher being made (launchersAtOnce)

	mu    sync.Mutex
	cells map[string]*cell
	// dying are the cells Kill has stopped and Remove has yet to remove: no background
	// work, no launcher, no spare.
	dying  map[string]*cell
	closed bool // Close was called: no more background work
}

// cell is what the engine holds for one cell in this run.
type cell struct {
	id       string
	next     int             // next child cgroup number
	oomKills int64           // OOM kills of removed child cgroups (v1 counts are per cgroup)
	removing map[string]bool // child cgroups whose kills are in oomKills, until they are gone
	spare    []string        // empty child cgroups made ahead
	filling  int             // spares being made
	// leftovers are the child cgroups of finished trees that still held processes when
	// they were closed.
	leftovers map[string]bool
	// template is what the cell's launchers are made with (SetTemplate); nil: none.
	template func() Start
	// launcher is the helper made ahead for the cell's next command (launcher.go);
	// launcherFailures counts those that failed in a row.
	launcher         *launcher
	launcherFailures int
	// zygote forks the cell's launchers (zygote.go); zygoteFailures counts those that
	// failed in a row.
	zygote         *zygote
	zygoteFailures int
	lastCommand    <-chan struct{} // the last command started: closed once it is over
	// jobs is the background cgroup work on this cell; added to only while the cell is in
	// Engine.cells and the Engine is not closed.
	jobs sync.WaitGroup
}

// EngineConfig configures an Engine.
type EngineConfig struct {
	Cgroups Cgroups // the parent of the cells; nil: none (trees are process groups)
	// Helper is the binary every confined process starts through, run as
	// `Helper HelperArg` (package initproc, or cmd/sidecar-init).
	Helper, HelperArg string
	// ColdStart makes every command start the plain way, without launchers: for
	// benchmarks that compare the two.
	ColdStart bool
	// Forks says the helper is the C one: it can be a zygote that forks launchers
	// (initproc.Config.Fork) and enter Start.MountNS, and it never starts a thread; false:
	// each launcher is a helper the daemon starts, in a copy of the daemon's namespace.
	Forks  bool
	Logger *slog.Logger
}

// NewEngine is an engine as cfg says.
func NewEngine(cfg EngineConfig) *Engine {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	e := &Engine{cg: cfg.Cgroups, log: cfg.Logger, helper: cfg.Helper, helperArg: cfg.HelperArg,
		coldStart: cfg.ColdStart, forks: cfg.Forks, launching: make(chan struct{}, launchersAtOnce), cells: map[string]*cell{}, dying: map[string]*cell{}}
	if cfg.Forks {
		var err error
		if e.spawner, err = startSpawner(cfg.Helper, cfg.HelperArg); err != nil {
			e.log.Warn("no helper spawner: helpers are started by the daemon itself", "err", err)
		}
	}
	return e
}

// Open makes the cell id with limits, or adopts the one an earlier run left (setting its
// limits again), and starts keeping spare children for it. Opening an open cell sets its
// limits.
func (e *Engine) Open(id string, l Limits) error {
	if err := e.cg.Provision(id, l); err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cells[id] == nil {
		e.cells[id] = &cell{id: id}
	}
	return nil
}

// Kill stops the cell: its background work ends and every process in its cgroups, its
// launcher and zygote too, is sent SIGKILL where none can fork first. When it returns none
// of them runs another instruction of its own; waiting for their exits and removing the
// cgroups is Remove's, which may come later (off a release's path). Killing a cell this
// run never opened, or one already removed, is not an error.
func (e *Engine) Kill(ctx context.Context, id string) error {
	e.mu.Lock()
	c := e.cells[id]
	if c != nil {
		delete(e.cells, id)
		e.dying[id] = c
	}
	e.mu.Unlock()
	var ours []int
	if c != nil {
		e.cancelLauncher(c) // one still waiting for quiet is not forked at all
		c.jobs.Wait()       // nor a spare or launcher made under our feet
		ours = e.killOwn(c)
	}
	stopped, err := e.cg.StopCell(ctx, id, ours)
	if err == nil && !stopped {
		_, err = e.cg.KillCell(ctx, id)
	}
	return err
}

// killOwn sends SIGKILL to the cell's launcher and zygote, without waiting (Remove reaps
// them), and returns their pids.
func (e *Engine) killOwn(c *cell) []int {
	e.mu.Lock()
	var procs []*os.Process
	if l := c.launcher; l != nil && l.started() {
		procs = append(procs, l.proc)
	}
	if z := c.zygote; z != nil && z.proc != nil {
		procs = append(procs, z.proc)
	}
	e.mu.Unlock()
	var pids []int
	for _, p := range procs {
		if p.Signal(os.Kill) == nil {
			pids = append(pids, p.Pid)
		}
	}
	return pids
}

// Remove kills every process in the cell (if Kill has not), waits for their exits and
// removes its cgroups, once its background work is done. Removing a cell this run never
// opened, or one already removed, is not an error.
func (e *Engine) Remove(ctx context.Context, id string) error {
	e.mu.Lock()
	c := e.cells[id]
	if c == nil {
		c = e.dying[id]
	}
	delete(e.cells, id)
	delete(e.dying, id)
	e.mu.Unlock()
	if c != nil {
		e.cancelLauncher(c) // one still waiting for quiet is not forked at all
		c.jobs.Wait()       // no spare or launcher is being made, nor a child removed, under our feet
		e.dropLauncher(c)
		e.dropZygote(c)
	}
	if _, err := e.cg.KillCell(ctx, id); err != nil {
		return err
	}
	return e.cg.RemoveCell(id)
}

// Sweep kills and removes the cgroups under the parent of cells that known does not
// know, but for named cells (IsCell). It returns the ids removed and the pids killed.
func (e *Engine) Sweep(ctx context.Context, known func(id string) bool) (removed []string, pids []int, err error) {
	ids, err := e.cg.Cells()
	if err != nil {
		return nil, nil, err
	}
	var errs []error
	for _, id := range ids {
		if known(id) || IsCell(id) {
			continue
		}
		killed, err := e.cg.KillCell(ctx, id)
		pids = append(pids, killed...)
		if err == nil {
			err = e.cg.RemoveCell(id)
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, id)
		e.log.InfoContext(ctx, "swept orphan cell cgroup", "cell", id, "killed", len(killed))
	}
	return removed, pids, errors.Join(errs...)
}

// Usage reports the cell's resource use, the OOM kills of its removed children included
// and its launcher's and zygote's pids left out: they are the engine's doing, not the
// cell's.
func (e *Engine) Usage(id string) (Usage, error) {
	e.mu.Lock()
	var removedOOM, launchers int64
	var removing map[string]bool
	if c := e.cells[id]; c != nil {
		removedOOM = c.oomKills
		removing = maps.Clone(c.removing)
		if c.launcher.started() {
			launchers = e.tasks(c.launcher.proc)
		}
		if c.zygote != nil {
			launchers += e.tasks(c.zygote.proc)
		}
	}
	e.mu.Unlock()
	u, err := e.cg.Usage(id, removing)
	u.OOMKills += removedOOM
	u.Pids = max(u.Pids-launchers, 0)
	return u, err
}

// Settle waits for the cell's background cgroup work (tests).
func (e *Engine) Settle(id string) {
	e.mu.Lock()
	c := e.cells[id]
	e.mu.Unlock()
	if c != nil {
		c.jobs.Wait()
	}
}

// Close waits for the background work, drops the cells' launchers and removes their spare
// children; the cells themselves stay, for a restarted daemon to adopt. Later trees
// still start, the plain way, in children made on the spot.
func (e *Engine) Close() error {
	e.mu.Lock()
	e.closed = true
	cells := append(slicesOf(e.cells), slicesOf(e.dying)...)
	e.mu.Unlock()
	var errs []error
	for _, c := range cells {
		e.cancelLauncher(c)
		c.jobs.Wait()
		e.dropLauncher(c)
		e.dropZygote(c)
		e.mu.Lock()
		spare := c.spare
		c.spare = nil
		e.mu.Unlock()
		for _, name := range spare {
			errs = append(errs, e.cg.RemoveChild(c.id, name))
		}
	}
	if e.spawner != nil {
		e.spawner.close()
	}
	return errors.Join(errs...)
}

func slicesOf(m map[string]*cell) []*cell {
	out := make([]*cell, 0, len(m))
	for _, c := range m {
		out = append(out, c)
	}
	return out
}

// live returns the cell id while it is open and the engine not closed; e.mu is held.
func (e *Engine) live(id string) *cell {
	if e.closed {
		return nil
	}
	return e.cells[id]
}

// newChild creates a child cgroup of cell id, skipping names left by an earlier run.
func (e *Engine) newChild(id string) (string, error) {
	e.mu.Lock()
	c := e.cells[id]
	e.mu.Unlock()
	if c == nil {
		return "", fmt.Errorf("cell %s is not open", id)
	}
	for range 1000 {
		e.mu.Lock()
		c.next++
		name := "p" + strconv.Itoa(c.next)
		e.mu.Unlock()
		err := e.cg.NewChild(id, name)
		if errors.Is(err, os.ErrExist) {
			continue
		}
		return name, err
	}
	return "", errors.New("no free child cgroup name")
}
