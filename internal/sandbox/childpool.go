package sandbox

import "errors"

// Child cgroups are made and removed off the exec path. On cgroup v1 a child is a
// directory in each of five hierarchies: making one costs about 0.5 ms and removing a
// used one about 1 ms, as much as the rest of starting /bin/true. So each lease keeps an
// empty child made ahead, and a finished command's child, once Kill has emptied
// it, is removed in the background. A spare is never reused: every command still gets a
// fresh cgroup whose counters (OOM kills, refused forks) are its own.

// spareChildren is how many empty child cgroups each lease keeps ready. One covers an
// agent's commands, which come one after another (the next spare is made while the
// command runs); a burst falls back to making children on the exec path. Each spare is a
// memory cgroup, whose kernel state grows with the number of CPUs, for every live lease.
const spareChildren = 1

// takeChild returns an empty child cgroup for a new command, a spare when there is one,
// and tops the spares up in the background.
func (s *Sandbox) takeChild(le *lease) (string, error) {
	s.mu.Lock()
	var name string
	if n := len(le.spare); n > 0 {
		name, le.spare = le.spare[n-1], le.spare[:n-1]
	}
	s.refillLocked(le)
	s.mu.Unlock()
	if name != "" {
		return name, nil
	}
	return s.newChild(le)
}

// returnSpare puts an empty, never entered child cgroup among the lease's spares (one just
// made, or one taken for a command that went to a launcher instead), or removes it if the
// lease is being torn down (Teardown waits for the job that made it before it removes the
// lease).
func (s *Sandbox) returnSpare(le *lease, name string) {
	s.mu.Lock()
	keep := !s.closed && s.leases[le.spec.ID] == le
	if keep {
		le.spare = append(le.spare, name)
	}
	s.mu.Unlock()
	if !keep {
		if err := s.cg.RemoveChild(le.spec.ID, name); err != nil {
			s.log.Warn("remove spare child cgroup", "lease", le.spec.ID, "cgroup", name, "err", err)
		}
	}
}

// refillLocked starts making spares up to spareChildren; s.mu is held. Background work
// is counted in le.jobs only while the lease is live, so Teardown and Close, which stop
// that first, can wait for all of it.
func (s *Sandbox) refillLocked(le *lease) {
	if s.closed || s.leases[le.spec.ID] != le {
		return
	}
	for len(le.spare)+le.filling < spareChildren {
		le.filling++
		le.jobs.Go(func() { s.makeSpare(le) })
	}
}

func (s *Sandbox) makeSpare(le *lease) {
	name, err := s.newChild(le)
	s.mu.Lock()
	le.filling--
	s.mu.Unlock()
	if err != nil {
		s.log.Warn("spare child cgroup", "lease", le.spec.ID, "err", err)
		return
	}
	s.returnSpare(le, name)
}

// dropChild removes a finished command's child cgroup, which Kill has emptied: in the
// background while the lease is live, else at once.
func (s *Sandbox) dropChild(id, child string) error {
	s.mu.Lock()
	le := s.leases[id]
	async := le != nil && !s.closed
	if async {
		le.jobs.Add(1)
	}
	s.mu.Unlock()
	remove := func() error {
		err := s.cg.RemoveChild(id, child)
		if err == nil && le != nil {
			s.mu.Lock()
			delete(le.removing, child)
			s.mu.Unlock()
		}
		return err
	}
	if !async {
		return remove()
	}
	go func() {
		defer le.jobs.Done()
		if err := remove(); err != nil {
			s.log.Warn("remove child cgroup", "lease", id, "cgroup", child, "err", err)
		}
	}()
	return nil
}

// Close waits for the background cgroup work, removes the leases' spare child cgroups and
// unmounts their PTY instances; the leases themselves stay, for a restarted daemon to
// adopt (Provision mounts their instances again). Call it at shutdown, after the last
// command has finished; later commands still work but keep no spares and use the host's
// PTYs.
func (s *Sandbox) Close() error {
	s.mu.Lock()
	s.closed = true
	if owner := s.owner; owner != nil {
		leasesLeft := len(s.leases) > 0
		defer owner.Close(leasesLeft) // the cgroup parent is free again once the work below is done
		s.owner = nil
	}
	les := make([]*lease, 0, len(s.leases))
	var pts []string
	for _, le := range s.leases {
		les = append(les, le)
		pts = append(pts, le.pts)
		le.pts = ""
	}
	s.mu.Unlock()
	var errs []error
	for _, dir := range pts {
		errs = append(errs, removePTS(dir))
	}
	if s.cg == nil {
		return errors.Join(errs...)
	}
	for _, le := range les {
		le.jobs.Wait()
		s.dropLauncher(le)
		s.mu.Lock()
		spare := le.spare
		le.spare = nil
		s.mu.Unlock()
		for _, name := range spare {
			errs = append(errs, s.cg.RemoveChild(le.spec.ID, name))
		}
	}
	return errors.Join(errs...)
}
