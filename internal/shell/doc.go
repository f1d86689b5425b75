// Package shell keeps persistent shell sessions in a lease: one shell process (bash when
// the lease has it, else sh) that runs commands one at a time, so that cd, export,
// functions and background jobs carry from one command to the next, while each command
// still gets its own exit code, stdout and stderr.
//
// A session's shell is an ordinary background process of package process (Start with a
// stdin pipe; it is listed with the lease's processes under the session's id and counts
// against MaxProcesses), so everything that ends a lease's processes ends its sessions.
// This package adds the framing (frame.go) and the rules of a session. It knows nothing
// of HTTP.
//
// Lifetimes and rules, precisely:
//   - A session lives until Close, until its shell exits (`exit 3`: the run that caused it
//     reports Ended and the shell's exit code, and the session is gone), or until the
//     process layer kills the shell (lease release or expiry, daemon shutdown). Sessions
//     are not persisted: a restarted daemon has none, and the shell's process record says
//     "lost". There is no idle timeout: the lease's TTL bounds a session.
//   - A session runs one command at a time; Run on a busy session fails with ErrBusy and
//     changes nothing.
//   - A command's stdin is /dev/null, so `cat` or `read x` return at once and nothing can
//     read the framing.
//   - A timeout (or the caller's ctx ending) interrupts the command, not the shell: SIGINT
//     to the shell's process group (the shell traps INT; background jobs of a
//     non-interactive shell ignore it), then, after InterruptGrace, SIGKILL to every
//     descendant of the shell that was not there when the command began (so background
//     jobs of earlier commands survive), then, after another grace, the shell itself,
//     which ends the session.
//   - A command's output is held in a process.Capture, so it is captured exactly as a
//     run-to-completion exec's: per stream up to the process layer's MaxOutputBytes, the
//     first 4 KiB always, beyond them only what the daemon-wide OutputBudgetBytes (shared
//     with every exec) grants, kept as the stream's head and end (RunRequest.
//     OutputHeadBytes); the middle is dropped, counted and flagged truncated, and the command
//     is never held back. The budget is given back once the reply is written (RunRequest.
//     Reply) or Run returns. Output a background job writes between commands is dropped;
//     during a command, it is that command's.
package shell
