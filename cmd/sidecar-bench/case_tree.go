package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// caseTree: a tree of many 4 KiB files up (UploadDir) and down (DownloadDir), vs tar piped
// through ssh, scp -r and rsync -a over ssh, vs a local tar | tar.
//
// Every contender moves the same files between the same two filesystems: up, from the
// tree under the run's directory into the lease's workdir (with disk_quota=loop an ext4
// on a loop device, where creating a file costs far less than on a busy host disk);
// down, from the lease's copy back to the run's directory. Writing the peers' copies
// anywhere else would measure the disks, not the tools.
func (b *bench) caseTree(ctx context.Context) error {
	src := filepath.Join(b.dir, "tree")
	b.log.Info("writing the tree", "files", b.sz.treeFiles, "dirs", b.sz.treeDirs)
	if err := writeTree(src, b.sz.treeFiles, b.sz.treeDirs); err != nil {
		return err
	}
	defer os.RemoveAll(src)
	l, err := b.acquire(ctx, bigLimits)
	if err != nil {
		return err
	}
	defer l.Release(context.WithoutCancel(ctx))
	if err := l.UploadDir(ctx, src, "tree"); err != nil {
		return err
	}
	// The lease's workdir as the host sees it (the daemon's work root is dir/leases).
	work := filepath.Join(b.dir, "leases", l.ID(), "work")
	remoteSrc := filepath.Join(work, "tree")
	if _, err := os.Stat(filepath.Join(remoteSrc, "d000")); err != nil {
		return fmt.Errorf("the lease's workdir is not where the bench looks: %w", err)
	}
	b.note("Trees: every contender writes up into the lease's workdir (%s) and down into the run's directory (%s), "+
		"so all of them create files on the same filesystems.", fsKind(work), fsKind(b.dir))
	upDst := filepath.Join(work, "peer-dst")
	defer os.RemoveAll(upDst)
	downDst := filepath.Join(b.dir, "tree-dst")
	defer os.RemoveAll(downDst)

	ssh := b.ssh.sshCommandLine()
	q := shellQuote
	// cleaned runs job timed, then removes dst outside the measured time.
	cleaned := func(name, dst string, job func(ctx context.Context) error) contender {
		return contender{name: name, run: func(ctx context.Context) (time.Duration, error) {
			if err := os.RemoveAll(dst); err != nil {
				return 0, err
			}
			start := time.Now()
			err := job(ctx)
			d := time.Since(start)
			if rerr := os.RemoveAll(dst); err == nil {
				err = rerr
			}
			return d, err
		}}
	}
	shell := func(script string) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			return runCmd(exec.CommandContext(ctx, "bash", "-c", "set -eo pipefail; "+script))
		}
	}
	localTar := func(from, to string) contender {
		return cleaned("tar | tar", to, shell(fmt.Sprintf("mkdir %s && tar -C %s -cf - . | tar -C %[1]s -xf -", q(to), q(from))))
	}

	up, err := interleave(ctx, b.sz.treeWarmup, b.sz.treeReps,
		contender{name: "sidecar up", run: func(ctx context.Context) (time.Duration, error) {
			start := time.Now()
			err := l.UploadDir(ctx, src, "up")
			d := time.Since(start)
			if err == nil {
				err = l.Remove(ctx, "up", true)
			}
			return d, err
		}},
		cleaned("tar | ssh tar", upDst, shell(fmt.Sprintf("tar -C %s -cf - . | %s bench-mux %s", q(src), ssh,
			q(fmt.Sprintf("mkdir %s && tar -C %[1]s -xf -", q(upDst)))))),
		cleaned("scp -r up", upDst, func(ctx context.Context) error { return runCmd(b.ssh.scp(ctx, true, src, "bench:"+upDst)) }),
		cleaned("rsync up", upDst, shell(fmt.Sprintf("rsync -a -e %s %s/ bench-mux:%s/", q(ssh), q(src), q(upDst)))),
		localTar(src, upDst))
	if err != nil {
		return err
	}
	down, err := interleave(ctx, b.sz.treeWarmup, b.sz.treeReps,
		cleaned("sidecar down", downDst, func(ctx context.Context) error { return l.DownloadDir(ctx, "tree", downDst) }),
		cleaned("ssh tar | tar", downDst, shell(fmt.Sprintf("mkdir %s && %s bench-mux %s | tar -C %[1]s -xf -", q(downDst), ssh,
			q(fmt.Sprintf("tar -C %s -cf - .", q(remoteSrc)))))),
		cleaned("scp -r down", downDst, func(ctx context.Context) error {
			return runCmd(b.ssh.scp(ctx, true, "bench:"+remoteSrc, downDst))
		}),
		cleaned("rsync down", downDst, shell(fmt.Sprintf("rsync -a -e %s bench-mux:%s/ %s/", q(ssh), q(remoteSrc), q(downDst)))),
		localTar(remoteSrc, downDst))
	if err != nil {
		return err
	}
	u := throughput(float64(b.sz.treeFiles), "files/s")
	name := fmt.Sprintf("%d × 4 KiB files in %d dirs", b.sz.treeFiles, b.sz.treeDirs)
	peers := []string{"`tar | ssh tar`", "`scp -r`", "`rsync -a` over ssh"}
	for i, p := range peers {
		b.add(row{name: name + " up", unit: u, sidecar: up[0], peerName: p, peer: up[i+1], floorName: "local tar | tar", floor: up[4]})
	}
	for i, p := range peers {
		b.add(row{name: name + " down", unit: u, sidecar: down[0], peerName: p, peer: down[i+1], floorName: "local tar | tar", floor: down[4]})
	}
	return nil
}

// fsKind names the filesystem holding p and its device ("ext4 on /dev/loop3").
func fsKind(p string) string {
	var st unix.Statfs_t
	if err := unix.Statfs(p, &st); err != nil {
		return "unknown filesystem"
	}
	kind := fmt.Sprintf("fs type %#x", st.Type)
	if st.Type == unix.EXT4_SUPER_MAGIC {
		kind = "ext4"
	}
	if dev := mountSource(p); dev != "" {
		kind += " on " + dev
	}
	return kind
}

// mountSource is the source of the deepest mount holding p, from /proc/self/mountinfo.
func mountSource(p string) string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	best, src := "", ""
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		sep := slices.Index(f, "-")
		if len(f) < 5 || sep < 0 || sep+2 >= len(f) {
			continue
		}
		mp := f[4]
		if (p == mp || strings.HasPrefix(p, strings.TrimSuffix(mp, "/")+"/")) && len(mp) >= len(best) {
			best, src = mp, f[sep+2]
		}
	}
	return src
}

// writeTree writes files files of 4 KiB random bytes spread over dirs directories.
func writeTree(root string, files, dirs int) error {
	rng := rand.NewChaCha8([32]byte{byte(time.Now().UnixNano())})
	buf := make([]byte, 4096)
	for d := range dirs {
		if err := os.MkdirAll(filepath.Join(root, fmt.Sprintf("d%03d", d)), 0o755); err != nil {
			return err
		}
	}
	for i := range files {
		_, _ = rng.Read(buf)
		p := filepath.Join(root, fmt.Sprintf("d%03d", i%dirs), fmt.Sprintf("f%05d", i))
		if err := os.WriteFile(p, buf, 0o644); err != nil {
			return err
		}
	}
	return nil
}
