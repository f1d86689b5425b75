// Package fsxfer confines file operations to one lease's workdir: atomic and resumable
// writes, digests, tar in and out, and the disk quota. It knows nothing of HTTP.
package fsxfer
