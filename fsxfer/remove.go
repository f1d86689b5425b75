package fsxfer

// RemoveTree removes the directory tree at the absolute path dir without following
// symlinks and without ever descending into a mount point (it fails instead, leaving the
// mount and what lies under it untouched). Lease directories are removed with it.
func RemoveTree(dir string) error {
	panic("fsxfer.RemoveTree: not implemented yet")
}
