package lease

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
)

// writeFileAtomic makes path hold data, or leaves it as it was: it writes a temp file in
// the same directory, fsyncs it, renames it over path and fsyncs the directory, so a crash
// at any point leaves the old or the new content, never a mix.
func writeFileAtomic(path string, data []byte, perm fs.FileMode) error {
	return writeAtomic(path, data, perm, os.Rename)
}

// createFileAtomic is writeFileAtomic that never replaces an existing file: when path
// exists it returns an error satisfying errors.Is(err, fs.ErrExist) and leaves it alone.
func createFileAtomic(path string, data []byte, perm fs.FileMode) error {
	return writeAtomic(path, data, perm, os.Link) // link(2) fails if path exists; rename would not
}

func writeAtomic(path string, data []byte, perm fs.FileMode, place func(tmp, path string) error) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if f != nil {
			_ = f.Close()
		}
		// After a rename the temp name is gone; after a link it must go.
		if rmErr := os.Remove(tmp); rmErr != nil && !errors.Is(rmErr, fs.ErrNotExist) && err == nil {
			err = rmErr
		}
	}()
	if err := f.Chmod(perm); err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	closeErr := f.Close()
	f = nil
	if closeErr != nil {
		return closeErr
	}
	if err := place(tmp, path); err != nil {
		return err
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
