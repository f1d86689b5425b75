package systemd

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// MaxCredential bounds a credential read by Credential; secrets are short.
const MaxCredential = 64 << 10

var (
	// ErrInvalidCredentialName is returned for a name that is empty or not a plain file name.
	ErrInvalidCredentialName = errors.New("systemd: invalid credential name")
	// ErrCredentialTooLarge is returned for a credential over MaxCredential bytes.
	ErrCredentialTooLarge = fmt.Errorf("systemd: credential larger than %d bytes", MaxCredential)
)

// Credential reads the credential name from $CREDENTIALS_DIRECTORY (LoadCredential= or
// SetCredential= in the unit). ok is false, with no error, when there is no credentials
// directory or no such credential. Trailing newlines are trimmed: credential files are
// usually written with echo or an editor.
func Credential(name string) (value string, ok bool, err error) {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
		return "", false, fmt.Errorf("%w: %q", ErrInvalidCredentialName, name)
	}
	dir := os.Getenv("CREDENTIALS_DIRECTORY")
	if dir == "" {
		return "", false, nil
	}
	f, err := os.Open(filepath.Join(dir, name))
	if errors.Is(err, fs.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("systemd: credential %s: %w", name, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxCredential+1))
	if err != nil {
		return "", false, fmt.Errorf("systemd: credential %s: %w", name, err)
	}
	if len(data) > MaxCredential {
		return "", false, fmt.Errorf("%w: %s", ErrCredentialTooLarge, name)
	}
	return strings.TrimRight(string(data), "\r\n"), true, nil
}
