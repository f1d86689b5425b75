package sandbox

import (
	"fmt"
	"os/exec"
	"syscall"
)

// Isolation is built in layers. Strict isolation needs the base layers (root, cgroups with
// memory, pids and cpu, a uid per lease, a mount namespace per process for a private /tmp
// and /proc, a network namespace per lease for network "none"); Landlock adds what the
// kernel offers on top. The names below are what /v1/info, the startup log and the
// sidecar_isolation_layer metric report (docs/api.md).
const (
	LayerCgroupV1 = "cgroup-v1"
	LayerCgroupV2 = "cgroup-v2"
	LayerUID      = "uid"      // a uid of its own per lease, no capabilities: DAC and signals
	LayerMountNS  = "mount-ns" // private /tmp and /proc (hidepid) per lease process
	LayerNetNS    = "net-ns"   // network "none": loopback only, abstract sockets per lease
	// Landlock filesystem rules (ABI 1), with reparenting (ABI 2: refer), truncation
	// (ABI 3) and device ioctls (ABI 5) under rule where the kernel has them.
	LayerLandlockFS         = "landlock-fs"
	LayerLandlockFSRefer    = "landlock-fs-refer"
	LayerLandlockFSTruncate = "landlock-fs-truncate"
	LayerLandlockFSIoctlDev = "landlock-fs-ioctl-dev"
	// Landlock scoping (ABI 6): no signal to, nor abstract socket of, anything outside the
	// lease's own Landlock domain, whatever the uids and namespaces.
	LayerLandlockScope = "landlock-scope"
)

// NoLandlock as Config.LandlockMaxABI applies no Landlock at all.
const NoLandlock = -1

// MaxKnownLandlockABI is the newest Landlock ABI whose rights the helpers know.
const MaxKnownLandlockABI = 7

// landlockLinux is the first Linux release with each Landlock ABI (see
// Documentation/userspace-api/landlock.rst): a floor the kernel misses names the kernel
// that has it.
var landlockLinux = [MaxKnownLandlockABI + 1]string{1: "5.13", 2: "5.19", 3: "6.2", 4: "6.7", 5: "6.10", 6: "6.12", 7: "6.15"}

// LandlockLinux is the first Linux release with Landlock ABI abi, "" if unknown.
func LandlockLinux(abi int) string {
	if abi < 1 || abi > MaxKnownLandlockABI {
		return ""
	}
	return landlockLinux[abi]
}

// appliedLandlockABI is the ABI lease processes get: the kernel's, capped by max (0: no
// cap, NoLandlock: none).
func appliedLandlockABI(kernel, max int) int {
	switch {
	case max == NoLandlock:
		return 0
	case max > 0 && kernel > max:
		return max
	}
	return kernel
}

// landlockLayers are the Landlock layers ABI abi gives, in the order they were added.
func landlockLayers(abi int) []string {
	var ls []string
	for _, l := range []struct {
		abi  int
		name string
	}{
		{1, LayerLandlockFS}, {2, LayerLandlockFSRefer}, {3, LayerLandlockFSTruncate},
		{5, LayerLandlockFSIoctlDev}, {6, LayerLandlockScope},
	} {
		if abi >= l.abi {
			ls = append(ls, l.name)
		}
	}
	return ls
}

// layers lists what is in force for c, base layers first.
func (c Caps) layers() []string {
	var ls []string
	switch c.Cgroups {
	case "v1":
		ls = append(ls, LayerCgroupV1)
	case "v2":
		ls = append(ls, LayerCgroupV2)
	}
	if c.UIDIsolation {
		ls = append(ls, LayerUID)
	}
	if c.PrivateTmp {
		ls = append(ls, LayerMountNS)
	}
	if c.NetworkIsolation {
		ls = append(ls, LayerNetNS)
	}
	return append(ls, landlockLayers(c.LandlockABI)...)
}

// Gaps says, for a strict sandbox, what covers each Landlock layer the kernel lacks, and
// what nothing covers; the daemon logs it at startup (docs/operations.md has the table).
func (c Caps) Gaps() []string {
	if c.Isolation != IsolationStrict {
		return nil
	}
	var g []string
	if c.LandlockABI < 6 {
		g = append(g,
			"signals: covered by the lease's own uid (no capabilities: it can signal only its own processes)",
			"abstract unix sockets: covered by the lease's network namespace with network \"none\"; a lease with network \"host\" can connect to abstract sockets of the host's network namespace")
	}
	if c.LandlockABI < 1 {
		g = append(g, "filesystem: uid and file modes only: a lease can read what is world-readable and write what is world-writable on the host (e.g. /var/tmp, /dev/shm), shared with other leases")
	}
	return g
}

// probeNamespaces checks that this process can make the namespaces strict isolation
// gives every lease: a mount and a cgroup namespace (made by each helper) and a network
// namespace. The first two are tried in a child (the helper, which exits at once without
// its config): unsharing one on a daemon thread would leave that thread with a root and
// working directory of its own, or, on the main thread, keep it alive in the namespace.
func probeNamespaces(helper string) []string {
	var missing []string
	for _, ns := range []struct {
		name, unit string // unit: its name in a systemd unit's RestrictNamespaces=
		flag       uintptr
	}{{"mount", "mnt", syscall.CLONE_NEWNS}, {"cgroup", "cgroup", syscall.CLONE_NEWCGROUP}} {
		probe := exec.Command(helper, HelperArg)
		probe.SysProcAttr = &syscall.SysProcAttr{Cloneflags: ns.flag}
		if err := probe.Start(); err != nil {
			missing = append(missing, fmt.Sprintf("%s namespaces (%v; a systemd unit's RestrictNamespaces= must allow %s)", ns.name, err, ns.unit))
		} else {
			_ = probe.Wait() // it fails, finding no config: only the clone mattered
		}
	}
	ns, err := newNetNS()
	if err != nil {
		missing = append(missing, fmt.Sprintf("network namespaces (%v)", err))
	} else {
		ns.Close()
	}
	return missing
}
