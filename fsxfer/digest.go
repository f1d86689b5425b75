package fsxfer

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// digestXattr caches a file's sha-256 next to it, with the size and mtime it was taken
// at, so that a download with ?digest=sha-256 need not read the file twice. The trusted
// namespace needs CAP_SYS_ADMIN: lease processes can neither read nor forge it. Without
// the capability (isolation "none") there is simply no cache.
const digestXattr = "trusted.sidecar.sha256"

// rememberDigest records sum for the open file h as it is now. Best effort.
func rememberDigest(h *os.File, sum []byte) {
	var st unix.Stat_t
	if len(sum) != sha256.Size || unix.Fstat(int(h.Fd()), &st) != nil {
		return
	}
	v := fmt.Sprintf("%d:%d:%x", st.Mtim.Nano(), st.Size, sum)
	_ = unix.Fsetxattr(int(h.Fd()), digestXattr, []byte(v), 0)
}

// cachedDigest returns the sha-256 recorded for h if the file's size and mtime are still
// those it was recorded at, else nil. A write changes the mtime; a lease that sets the
// mtime back after changing the content gets a digest that no longer matches, so its own
// download fails verification rather than passing silently.
func cachedDigest(h *os.File) []byte {
	buf := make([]byte, 128)
	n, err := unix.Fgetxattr(int(h.Fd()), digestXattr, buf)
	if err != nil {
		return nil
	}
	parts := strings.Split(string(buf[:n]), ":")
	if len(parts) != 3 {
		return nil
	}
	var st unix.Stat_t
	if unix.Fstat(int(h.Fd()), &st) != nil || parts[0] != strconv.FormatInt(st.Mtim.Nano(), 10) || parts[1] != strconv.FormatInt(st.Size, 10) {
		return nil
	}
	sum, err := hex.DecodeString(parts[2])
	if err != nil || len(sum) != sha256.Size {
		return nil
	}
	return sum
}
