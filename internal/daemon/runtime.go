package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/fsxfer"
	"github.com/sidecar-sandbox/sidecar/internal/process"
	"github.com/sidecar-sandbox/sidecar/internal/sandbox"
	"github.com/sidecar-sandbox/sidecar/internal/shell"
	"github.com/sidecar-sandbox/sidecar/lease"
	"github.com/sidecar-sandbox/sidecar/lease/disk"
	"github.com/sidecar-sandbox/sidecar/lease/image"
	"github.com/sidecar-sandbox/sidecar/lease/netpolicy"
	"github.com/sidecar-sandbox/sidecar/lease/network"
)

// Runtime is what a lease has beyond its record: the sandbox (cgroup, uid, netns), its
// processes and its open filesystem. It is the lease manager's Provisioner, so that
// release, expiry and the reaper all take the same path down, and the server's Files
// and Host.
type Runtime struct {
	Sandbox    *sandbox.Sandbox
	Processes  *process.Manager
	Shells     *shell.Manager // nil: none (its sessions die with their shells anyway)
	UploadIdle time.Duration
	Disk       *disk.Quotas    // nil: usage is the fsxfer meter's scan
	Budgets    *fsxfer.Budgets // searches and watches of all leases; nil: fsxfer's per-process one
	// Network serves each lease's egress inside its network namespace; nil: leases
	// share the host's network (SIDECAR_NETWORK_ISOLATION=host, or isolation none).
	Network *network.Manager
	// Images is the image store leases with an Image run on.
	Images *image.Store
	// RootImages are the images whose leases run as root in a user namespace of their own
	// (SIDECAR_ROOT_IMAGES), decided at each Provision: a restart with the setting changed
	// changes it for the leases it restores.
	RootImages map[string]bool
	// OwnedImages: leases on images own what root owns in them (id-mapped layers), so
	// that they change it as root in a container would; false where the host cannot
	// (ProbeRootLeases failed): they read the image's files as root's.
	OwnedImages bool

	mu    sync.Mutex
	fss   map[string]*fsxfer.FS
	roots map[string]leaseRoot // by lease id: the image each lease holds
}

// leaseRoot is a lease's hold on its image.
type leaseRoot struct {
	root    *image.Root
	release func()
}

var (
	_ lease.Provisioner   = (*Runtime)(nil)
	_ lease.NetworkSetter = (*Runtime)(nil)
)

func (rt *Runtime) sandboxSpec(l lease.Lease) sandbox.LeaseSpec {
	return sandbox.LeaseSpec{
		ID:            l.ID,
		UID:           l.UID,
		GID:           l.GID,
		Workdir:       l.Workdir(),
		TmpDir:        l.TmpDir(),
		HomeDir:       l.HomeDir(),
		MemoryBytes:   l.Limits.MemoryBytes,
		CPUMillicores: l.Limits.CPUMillicores,
		Pids:          l.Limits.Pids,
		Network:       rt.leaseNetwork(l),
		Root:          rt.leaseRoot(l),
	}
}

// leaseRoot is the root filesystem the lease's processes see: its image's layers under a
// writable layer of its own, or nil for the host's root; with the snapshot's workspace and
// home stacked under its own where seedMode says so.
func (rt *Runtime) leaseRoot(l lease.Lease) *sandbox.LeaseRoot {
	r := rt.rootFor(l.ID)
	if r == nil {
		return nil
	}
	root := &sandbox.LeaseRoot{Layers: r.Layers, Env: r.Env, WorkingDir: r.WorkingDir, AsRoot: rt.RootImages[r.Base], Owned: rt.OwnedImages}
	if rt.seedMode(l, r) == seedStack {
		for _, t := range seedTrees(l) {
			if st, err := os.Lstat(filepath.Join(r.Seed, t.from)); t.to != "" && err == nil && st.IsDir() {
				root.Stacks = append(root.Stacks, sandbox.Stack{Dir: t.to, Lower: filepath.Join(r.Seed, t.from)})
			}
		}
	}
	return root
}

// seedMode is how a lease on a snapshot gets the snapshot's workspace and home.
type seedMode int

const (
	seedNone  seedMode = iota // not on a snapshot, or its copies are made already
	seedStack                 // an overlay on the snapshot's trees: nothing copied
	seedCopy                  // copies of its own, made now
)

// seedMode says how lease l, on root r, gets its snapshot's trees. Stacking needs a lease
// that owns its layers (id-mapped); elsewhere the trees are copied, once, at the first
// Provision (its writable layer's directory is not there yet). A lease keeps what it
// started with across restarts: stacks are mounted again, copies stay its own.
func (rt *Runtime) seedMode(l lease.Lease, r *image.Root) seedMode {
	if r == nil || r.Seed == "" {
		return seedNone
	}
	spec := sandbox.LeaseSpec{Workdir: l.Workdir()}
	_, err := os.Lstat(filepath.Dir(sandbox.WritableLayer(spec)))
	first := err != nil
	_, err = os.Lstat(sandbox.StacksDir(spec))
	stacked := err == nil
	switch owned := rt.OwnedImages || rt.RootImages[r.Base]; {
	case owned && (first || stacked):
		return seedStack
	case first:
		return seedCopy
	}
	return seedNone
}

// seedTrees are where a snapshot's trees go in a lease started from it.
func seedTrees(l lease.Lease) []struct{ from, to string } {
	return []struct{ from, to string }{{image.SnapshotWorkspace, l.Workdir()}, {image.SnapshotHome, l.HomeDir()}}
}

// leaseNetwork is how a lease reaches out: through the daemon from a namespace of its own,
// or, on the host's network, not at all for egress "none" (loopback only).
func (rt *Runtime) leaseNetwork(l lease.Lease) *sandbox.LeaseNetwork {
	switch {
	case rt.Network != nil:
		return &sandbox.LeaseNetwork{Env: network.LeaseEnv(), ResolvConf: network.ResolvConf}
	case l.Network.Egress == netpolicy.EgressNone:
		return &sandbox.LeaseNetwork{}
	}
	return nil
}

// Provision sets the lease's sandbox and network up (idempotent: called again after a
// restart).
func (rt *Runtime) Provision(ctx context.Context, l lease.Lease) error {
	if err := rt.holdImage(l); err != nil {
		return err
	}
	spec := rt.sandboxSpec(l)
	if err := rt.seed(l); err != nil {
		return err
	}
	if err := rt.Sandbox.Provision(ctx, spec); err != nil {
		return err
	}
	if rt.Network == nil {
		return nil
	}
	ns, err := rt.Sandbox.NetNS(l.ID)
	if err != nil {
		return err
	}
	return rt.Network.Attach(l.ID, ns, l.Network)
}

// holdImage takes the lease's hold on its image (once: Provision runs again at a
// restart), so that the store keeps its layers until the lease is torn down.
func (rt *Runtime) holdImage(l lease.Lease) error {
	if l.Image == "" {
		return nil
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if _, ok := rt.roots[l.ID]; ok {
		return nil
	}
	if rt.Images == nil {
		return fmt.Errorf("lease %s runs on image %q, and this daemon has no image store", l.ID, l.Image)
	}
	root, release, err := rt.Images.Use(l.Image)
	if err != nil {
		return err
	}
	if rt.roots == nil {
		rt.roots = map[string]leaseRoot{}
	}
	rt.roots[l.ID] = leaseRoot{root: root, release: release}
	return nil
}

// seed copies the snapshot's workspace and home into a new lease where seedMode says so.
func (rt *Runtime) seed(l lease.Lease) error {
	r := rt.rootFor(l.ID)
	if rt.seedMode(l, r) != seedCopy {
		return nil
	}
	for _, t := range seedTrees(l) {
		if t.to == "" {
			continue
		}
		err := image.CopyTree(filepath.Join(r.Seed, t.from), t.to, l.UID, l.GID)
		if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
			return fmt.Errorf("%w: snapshot %s: its %s does not fit the lease's disk; acquire with a larger disk_bytes", fsxfer.ErrQuota, r.Name, t.from)
		}
		if err != nil {
			return fmt.Errorf("snapshot %s: copying its %s into lease %s: %w", r.Name, t.from, l.ID, err)
		}
	}
	return nil
}

// Snapshot saves lease l's writable layer, workspace and home as the image name, on top
// of the image l runs on (lease/image/snapshot.go).
func (rt *Runtime) Snapshot(ctx context.Context, l lease.Lease, name string) (image.Info, error) {
	r := rt.rootFor(l.ID)
	if r == nil {
		return image.Info{}, fmt.Errorf("%w: lease %s runs on the host's root, which a snapshot cannot hold; acquire it on an image (image in the acquire body)", sandbox.ErrInvalid, l.ID)
	}
	spec := rt.sandboxSpec(l)
	return rt.Images.Snapshot(ctx, name, image.SnapshotSource{
		Base: r.Name, Lease: l.ID, UID: l.UID, GID: l.GID,
		Trees: []image.Tree{{Dir: sandbox.WritableLayer(spec)}, {Dir: spec.Workdir, At: image.SnapshotWorkspace}, {Dir: spec.HomeDir, At: image.SnapshotHome}},
	})
}

// SpareCurrent says whether a spare lease (lease/spare.go) still runs on what its image's
// name holds now: not when the image was pulled again or removed since it was made.
func (rt *Runtime) SpareCurrent(l lease.Lease) bool {
	r := rt.rootFor(l.ID)
	if r == nil {
		return true
	}
	in, err := rt.Images.Get(r.Name)
	return err == nil && in.Digest == r.Digest
}

// rootFor is the image root the lease with this id runs on: its layers (top first) and
// the image's Env, WorkingDir and User; nil for the host's root. It is the seam the
// sandbox's lease spec takes its root from.
func (rt *Runtime) rootFor(id string) *image.Root {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.roots[id].root
}

// SetNetwork applies a lease's replaced policy to its connections from now on.
func (rt *Runtime) SetNetwork(_ context.Context, l lease.Lease) error {
	if rt.Network == nil {
		return fmt.Errorf("%w: leases share the host's network (SIDECAR_NETWORK_ISOLATION=host, or isolation none): a policy cannot change on a running lease", sandbox.ErrUnsupported)
	}
	return rt.Network.SetPolicy(l.ID, l.Network)
}

// Teardown ends the lease's shells and process records, closes its filesystem, kills
// every process of the lease and unmounts its image root (sandbox.Sandbox.Teardown), then
// lets go of its image; the rest is Retire's.
func (rt *Runtime) Teardown(ctx context.Context, l lease.Lease) error {
	if rt.Shells != nil {
		rt.Shells.ReleaseLease(l.ID) // first, so that no session outlives its shell in the table
	}
	rt.Processes.ReleaseLease(l.ID)
	if rt.Network != nil {
		rt.Network.Detach(l.ID)
	}
	rt.mu.Lock()
	f := rt.fss[l.ID]
	delete(rt.fss, l.ID)
	rt.mu.Unlock()
	if f != nil {
		_ = f.Close()
	}
	if err := rt.Sandbox.Teardown(ctx, l.ID); err != nil {
		return err // the hold stays while the lease's processes may still run on the image
	}
	rt.releaseImage(l.ID)
	return nil
}

// Retire waits for the lease's processes to exit and removes its cgroups, PTY instance and
// user files (sandbox.Sandbox.Retire); the lease manager calls it after the journal says
// the lease is gone, before its directory goes.
func (rt *Runtime) Retire(ctx context.Context, l lease.Lease) error {
	return rt.Sandbox.Retire(ctx, l.ID)
}

// releaseImage lets go of the lease's image: its layers may go once nothing else holds
// them.
func (rt *Runtime) releaseImage(id string) {
	rt.mu.Lock()
	r, ok := rt.roots[id]
	delete(rt.roots, id)
	rt.mu.Unlock()
	if ok {
		r.release()
	}
}

// FS returns the lease's confined filesystem, opened on first use.
func (rt *Runtime) FS(l lease.Lease) (*fsxfer.FS, error) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if f, ok := rt.fss[l.ID]; ok {
		return f, nil
	}
	uid, gid := -1, -1
	if l.UID != 0 {
		uid, gid = l.UID, l.GID
	}
	f, err := fsxfer.Open(fsxfer.Config{
		Workdir:    l.Workdir(),
		Mount:      sandbox.Workspace,
		UploadsDir: l.UploadsDir(),
		UsageRoot:  l.Dir,
		UID:        uid,
		GID:        gid,
		QuotaBytes: l.Limits.DiskBytes,
		UploadIdle: rt.UploadIdle,
		Budgets:    rt.Budgets,
	})
	if err != nil {
		return nil, err
	}
	if rt.fss == nil {
		rt.fss = map[string]*fsxfer.FS{}
	}
	rt.fss[l.ID] = f
	return f, nil
}

// Usage is the lease's live consumption; parts that cannot be read are left zero.
func (rt *Runtime) Usage(ctx context.Context, l lease.Lease) *apitype.Usage {
	var u apitype.Usage
	if su, err := rt.Sandbox.Usage(l.ID); err == nil {
		u.MemoryBytes, u.CPUSeconds, u.Pids, u.OOMKills = su.MemoryBytes, su.CPUSeconds, su.Pids, su.OOMKills
	}
	// A lease with a filesystem of its own reads its usage off it, exact and at once;
	// otherwise the meter scans the lease directory.
	if rt.Disk != nil {
		if n, ok, err := rt.Disk.Usage(l.Dir); err == nil && ok {
			u.DiskBytes = n
			return &u
		}
	}
	if f, err := rt.FS(l); err == nil {
		if n, err := f.Usage(ctx); err == nil {
			u.DiskBytes = n
		}
	}
	return &u
}

// Leftovers lists what the lease's finished commands left running; none when it
// cannot be read.
func (rt *Runtime) Leftovers(l lease.Lease) ([]apitype.Leftover, int) {
	procs, n, err := rt.Sandbox.Leftovers(l.ID)
	if err != nil || n == 0 {
		return nil, 0
	}
	out := make([]apitype.Leftover, 0, min(len(procs), apitype.MaxLeftoversListed))
	for _, p := range procs[:min(len(procs), apitype.MaxLeftoversListed)] {
		out = append(out, apitype.Leftover{PID: p.PID, Argv: p.Argv, StartedAt: p.StartedAt, RSSBytes: p.RSSBytes})
	}
	return out, n
}

// SignalLeftover signals one leftover process of the lease.
func (rt *Runtime) SignalLeftover(l lease.Lease, pid int, sig syscall.Signal) error {
	return rt.Sandbox.SignalLeftover(l.ID, pid, sig)
}

// Caps is the isolation in force.
func (rt *Runtime) Caps() sandbox.Caps { return rt.Sandbox.Caps() }

// host is the Runtime as the server's sidecar.Host, joined with the lease table, which is
// built on the Runtime (its Provisioner): the sweep needs both.
type host struct {
	*Runtime
	leases *lease.Manager
}

// Cleanup reaps expired leases and anything a previous run left behind that no lease
// accounts for: cgroups (and their processes) and workdirs.
func (h host) Cleanup(ctx context.Context) (apitype.CleanupResult, error) {
	rt, leases := h.Runtime, h.leases
	res := apitype.CleanupResult{Leases: []string{}, Cgroups: []string{}, Workdirs: []string{}, Processes: []int{}}
	reaped, err := leases.Reap(ctx)
	if err != nil {
		return res, err
	}
	for _, l := range reaped {
		res.Leases = append(res.Leases, l.ID)
	}
	cgroups, pids, err := rt.Sandbox.Sweep(ctx, leases.Owns)
	if err != nil {
		return res, err
	}
	res.Cgroups = append(res.Cgroups, cgroups...)
	res.Processes = append(res.Processes, pids...)
	dirs, err := leases.Orphans(ctx)
	if err != nil {
		return res, err
	}
	res.Workdirs = append(res.Workdirs, dirs...)
	// Idle partial uploads of live leases.
	rt.mu.Lock()
	fss := make([]*fsxfer.FS, 0, len(rt.fss))
	for _, f := range rt.fss {
		fss = append(fss, f)
	}
	rt.mu.Unlock()
	for _, f := range fss {
		_, _ = f.ReapUploads(time.Now())
	}
	return res, nil
}
