// Package fsxfer confines file operations to one lease's workdir: atomic and resumable
// writes, digests, tar in and out, and the disk quota. It knows nothing of HTTP.
//
// Confinement. Every lease path is validated lexically first ("..", absolute paths and
// NUL bytes are ErrOutside) and then resolved through an os.Root at the workdir, which
// refuses symlinks that lead out. What os.Root leaves open is closed here: the last
// element of a path is handled with *at system calls on the parent's descriptor, so it
// is never followed where it must not be; files are opened non-blocking and anything but
// a regular file is refused after fstat, so a FIFO or device never blocks or leaks; a
// file with several hard links is served or replaced only when it belongs to the lease
// uid; mode and owner are set by descriptor; walks and removals compare mount IDs and
// never enter another mount (os.Root.RemoveAll would).
//
// Atomicity. A file is written to a temporary name in its directory, fsynced and renamed
// into place; a tree is extracted into a staging directory and moved into place. A
// failure removes what it made. Temporary names start with ".sidecar-tmp-".
//
// Agents' tools. Find, Grep and Watch walk with the directory descriptors they opened
// (never a symlink, never another mount, never a directory of another uid) and read only
// regular files of the lease uid, each bounded by explicit limits and a truncated flag;
// Replace and conditional writes (IfMatch, Exclusive) go through the atomic write path.
//
// Memory stays flat: data moves in pooled 1 MiB buffers, hashing runs in a second
// goroutine on the buffer just written, and all-zero blocks become holes.
package fsxfer
