// Package process supervises the processes of a lease: commands run to completion
// (Exec) and background processes (Start) whose output is numbered by byte offset so
// that several watchers can attach, drop and resume exactly where they stopped.
//
// Every process comes from the Execer (package sandbox's Sandbox, the layer below, which
// also owns Spec, Tree and the checks of argv, environment and working directory). This
// package owns what happens after that, and the bounds of timeouts and terminal sizes: pipes or a PTY, pumping output, timeouts,
// signals, exit status, and a small JSON record per background process so that a
// daemon restart reports processes that died with it as "lost", never as exit 0.
//
// It knows nothing of HTTP or websockets. An attach handler, for instance, is:
//
//	p, err := m.Get(lease, pid)                // ErrNotFound
//	sub, err := p.Subscribe(since)             // -1 for live; ErrInvalid past the end
//	defer sub.Close()
//	// 101 headers: X-Output-Offset = sub.Offset(), X-Output-Bytes-Lost = sub.Lost()
//	// reader goroutine: stdin → p.WriteStdin, "255 0" → p.CloseStdin, resize → p.Resize
//	for {
//		c, err := sub.Next(ctx)                // io.EOF once the process ended
//		if err != nil { break }
//		send(c.Channel, c.Data)                // Data is shared: do not modify
//	}
//	// on io.EOF: status frame from p.Status(), bytes_lost from sub.Lost()
//
// Lifetimes, precisely:
//   - A process's exit is its main process's exit. After it, output is collected until
//     every pipe (or the PTY) closes or outputGrace (200ms) passes, whichever comes
//     first; then Tree.Close kills whatever the process left behind, and what it left
//     in the pipes is still read (bounded by another outputGrace, after which reading
//     stops even if something outside the tree holds a pipe). So a background job
//     started with "cmd &" by a shell that then exits does not outlive the shell, and
//     no grandchild can keep a process from ending.
//   - An Exec holds one of its lease's MaxExecs slots, and the capacity of its output
//     buffers against the daemon-wide OutputBudgetBytes, from admission until its Reply
//     returns (or Exec returns, without one).
//   - Timeouts and idle timeouts kill the whole tree (Tree.Kill) and mark TimedOut.
//   - A process killed by a signal reports ExitCode 128+signo (the shell convention)
//     and Signal set to the name without "SIG", e.g. "KILL".
package process
