package process

// Kill kills the process's whole tree: its own cgroup, so descendants that called
// setsid or double-forked die too. A finished, failed or lost process is left alone.
// The websocket exec route uses it when its connection closes.
func (p *Process) Kill() error {
	<-p.ready
	if p.run == nil || p.startErr != nil {
		return nil
	}
	select {
	case <-p.done:
		return nil
	default:
	}
	p.run.kill(false)
	return nil
}
