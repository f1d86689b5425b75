package disk

import (
	"testing"

	"github.com/sidecar-sandbox/sidecar/internal/testtool"
)

// The loop tests skip without mkfs.ext4 (needLoop); under SIDECAR_TEST_REQUIRE_ALL=1 (CI,
// which installs e2fsprogs) this fails instead, so they cannot stop running unnoticed.
func TestMkfsFoundWhereRequired(t *testing.T) {
	if _, err := findMkfs(); err != nil {
		testtool.Missing(t, err.Error())
	}
}
