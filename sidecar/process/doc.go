// Package process supervises the processes of a lease: commands run to completion
// (Exec) and background processes (Start) whose output is numbered by byte offset so
// that several watchers can attach, drop and resume exactly where they stopped.
//
// Every process comes from the Execer, the one place lease processes are made. This
// package owns what happens after that: pipes or a PTY, pumping output, timeouts,
// signals, exit status, and a small JSON record per background process so that a
// daemon restart reports processes that died with it as "lost", never as exit 0.
//
// It knows nothing of HTTP or websockets; the daemon's attach handler is a loop over
// Subscription.Next plus Process.WriteStdin, CloseStdin and Resize.
//
// Lifetimes, precisely:
//   - A process's exit is its main process's exit. After it, output is collected until
//     every pipe (or the PTY) closes or outputGrace passes, whichever comes first; then
//     Tree.Close kills whatever the process left behind. So a background job started
//     with "cmd &" by a shell that then exits does not outlive the shell.
//   - Timeouts and idle timeouts kill the whole tree (Tree.Kill) and mark TimedOut.
//   - A process killed by a signal reports ExitCode 128+signo (the shell convention)
//     and Signal set to the name without "SIG", e.g. "KILL".
package process
