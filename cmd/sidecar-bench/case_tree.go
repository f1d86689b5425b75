package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// caseTree: a tree of many 4 KiB files up (UploadDir) and down (DownloadDir), vs tar piped
// through ssh, scp -r and rsync -a over ssh, vs a local tar | tar.
func (b *bench) caseTree(ctx context.Context) error {
	src := filepath.Join(b.dir, "tree")
	b.log.Info("writing the tree", "files", b.sz.treeFiles, "dirs", b.sz.treeDirs)
	if err := writeTree(src, b.sz.treeFiles, b.sz.treeDirs); err != nil {
		return err
	}
	defer os.RemoveAll(src)
	dst := filepath.Join(b.dir, "tree-dst")
	defer os.RemoveAll(dst)
	l, err := b.acquire(ctx, bigLimits)
	if err != nil {
		return err
	}
	defer l.Release(context.WithoutCancel(ctx))
	if err := l.UploadDir(ctx, src, "tree"); err != nil {
		return err
	}

	ssh := b.ssh.sshCommandLine()
	q := shellQuote
	// then removes the destination outside the measured time.
	cleaned := func(name string, job func(ctx context.Context) error) contender {
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
	floor := cleaned("tar | tar", shell(fmt.Sprintf("mkdir %s && tar -C %s -cf - . | tar -C %[1]s -xf -", q(dst), q(src))))

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
		cleaned("tar | ssh tar", shell(fmt.Sprintf("tar -C %s -cf - . | %s bench-mux %s", q(src), ssh,
			q(fmt.Sprintf("mkdir %s && tar -C %[1]s -xf -", q(dst)))))),
		cleaned("scp -r up", func(ctx context.Context) error { return runCmd(b.ssh.scp(ctx, true, src, "bench:"+dst)) }),
		cleaned("rsync up", shell(fmt.Sprintf("rsync -a -e %s %s/ bench-mux:%s/", q(ssh), q(src), q(dst)))),
		floor)
	if err != nil {
		return err
	}
	down, err := interleave(ctx, b.sz.treeWarmup, b.sz.treeReps,
		cleaned("sidecar down", func(ctx context.Context) error { return l.DownloadDir(ctx, "tree", dst) }),
		cleaned("ssh tar | tar", shell(fmt.Sprintf("mkdir %s && %s bench-mux %s | tar -C %[1]s -xf -", q(dst), ssh,
			q(fmt.Sprintf("tar -C %s -cf - .", q(src)))))),
		cleaned("scp -r down", func(ctx context.Context) error { return runCmd(b.ssh.scp(ctx, true, "bench:"+src, dst)) }),
		cleaned("rsync down", shell(fmt.Sprintf("rsync -a -e %s bench-mux:%s/ %s/", q(ssh), q(src), q(dst)))),
		floor)
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
