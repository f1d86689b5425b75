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
//     first; then the run is done (the Exec replies, a background process ends) and
//     Tree.Close leaves whatever the process left behind in the lease: its leftovers
//     (package sandbox), which live until they exit, are signalled one by one, or the
//     lease is torn down. A leftover still holding a pipe is read from afterwards and
//     its output dropped, so it never blocks on a full pipe nor dies of EPIPE, and no
//     grandchild can keep a process from ending. A PTY is closed at the end of the run.
//   - A lossless Subscription (SubscribeLossless) holds the bytes it has not read in
//     the replay buffer: a pump that would drop them waits, the pipe fills and the
//     process blocks in write, for every viewer; lossy ones still lose only their own
//     bytes. Nothing beyond BufferBytes is queued. The wait ends when the subscription
//     moves on or closes, at the Manager's Shutdown, and at the end of the run: after
//     the main process exits, output is collected past outputGrace while it still goes
//     to such a reader (or a pump waits for one), for at most losslessTail (10s) in all; what the ring then drops
//     is counted in that reader's Lost. StartRequest.Lossless holds the output from
//     byte 0 for the first lossless Subscription, for at most LosslessAttachWait.
//   - KillLeftovers (ExecRequest, StartRequest) keeps the old behaviour: after the
//     first grace the tree is killed (Tree.Kill), and what it left in the pipes is still
//     read, bounded by another outputGrace.
//   - An Exec holds one of its lease's MaxExecs slots, and the capacity of its output
//     buffers against the daemon-wide OutputBudgetBytes, from admission until its Reply
//     returns (or Exec returns, without one). A Capture (NewCapture: output a caller
//     collects itself, a shell session's command) charges the same budget until Release.
//   - Timeouts and idle timeouts kill the whole tree (Tree.Kill), `&` children
//     included, and mark TimedOut; so do Kill, a canceled Exec and ReleaseLease.
//   - A process killed by a signal reports ExitCode 128+signo (the shell convention)
//     and Signal set to the name without "SIG", e.g. "KILL".
package process
