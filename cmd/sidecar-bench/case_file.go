package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// bigLimits are the limits of the leases that move big files and streams: the small
// defaults are for the many-leases case.
var bigLimits = apitype.Limits{MemoryBytes: 1 << 30, Pids: 256}

// caseFile: one big file up (digest checked and fsynced by the daemon) and down (digest
// checked by the client), vs scp with the chosen cipher, vs raw TLS 1.3 in Go; sha-256 in
// Go is shown as a second floor.
func (b *bench) caseFile(ctx context.Context) error {
	n := b.sz.fileBytes
	local := filepath.Join(b.dir, "big.bin")
	b.log.Info("writing a file of random bytes", "bytes", n)
	sum, err := writeRandomFile(local, n)
	if err != nil {
		return err
	}
	defer os.Remove(local)
	sshDst := filepath.Join(b.dir, "ssh-dst")
	if err := os.MkdirAll(sshDst, 0o755); err != nil {
		return err
	}
	defer os.RemoveAll(sshDst)
	l, err := b.acquire(ctx, bigLimits)
	if err != nil {
		return err
	}
	defer l.Release(context.WithoutCancel(ctx))
	floor, err := newTLSFloor()
	if err != nil {
		return err
	}
	defer floor.close()

	upload := func(ctx context.Context) error {
		f, err := os.Open(local)
		if err != nil {
			return err
		}
		defer f.Close()
		return l.Upload(ctx, "big.bin", f, n, client.UploadOptions{SHA256: sum})
	}
	s, err := interleave(ctx, 1, b.sz.bigReps,
		timed("sidecar upload", upload),
		timed("scp upload", func(ctx context.Context) error {
			return runCmd(b.ssh.scp(ctx, false, local, "bench:"+filepath.Join(sshDst, "big.bin")))
		}),
		timed("tls", func(ctx context.Context) error { return floor.send(n) }),
		timed("copy + fsync", func(context.Context) error { return copySynced(local, filepath.Join(b.dir, "fsync-floor.bin")) }))
	if err != nil {
		return err
	}
	mb := throughput(float64(n), "MB/s")
	up := fmt.Sprintf("upload %s, digest + fsync", sizeName(n))
	b.add(row{name: up, unit: mb, sidecar: s[0], peerName: "scp", peer: s[1], floorName: "TLS 1.3 loopback", floor: s[2]})
	b.add(row{name: up, unit: mb, sidecar: s[0], peerName: "scp", peer: s[1], floorName: "local copy + fsync", floor: s[3]})

	s, err = interleave(ctx, 1, b.sz.bigReps,
		timed("sidecar download", func(ctx context.Context) error {
			got, err := l.Download(ctx, "big.bin", discardCounter{})
			if err == nil && got != n {
				err = fmt.Errorf("downloaded %d of %d bytes", got, n)
			}
			return err
		}),
		timed("scp download", func(ctx context.Context) error {
			return runCmd(b.ssh.scp(ctx, false, "bench:"+filepath.Join(sshDst, "big.bin"), "/dev/null"))
		}),
		timed("tls", func(ctx context.Context) error { return floor.send(n) }))
	if err != nil {
		return err
	}
	b.add(row{name: fmt.Sprintf("download %s, digest", sizeName(n)), unit: mb, sidecar: s[0],
		peerName: "scp", peer: s[1], floorName: "TLS 1.3 loopback", floor: s[2]})

	s, err = interleave(ctx, 1, b.sz.bigReps, timed("sha-256", func(context.Context) error { return hashFloor(n) }))
	if err != nil {
		return err
	}
	b.add(row{name: fmt.Sprintf("sha-256 of %s in Go (a floor of both)", sizeName(n)), unit: mb,
		floorName: "sha-256", floor: s[0]})
	b.note("upload passes the precomputed sha-256 (UploadOptions.SHA256), so the client reads the file once; " +
		"the daemon verifies the digest and fsyncs before replying. scp (SFTP protocol) neither verifies nor fsyncs. " +
		"Downloads go to a discarding writer and /dev/null.")
	return nil
}

// writeRandomFile writes n random bytes to path and returns their sha-256.
func writeRandomFile(path string, n int64) ([]byte, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	rng := rand.NewChaCha8([32]byte{byte(time.Now().UnixNano())})
	if _, err := io.CopyN(io.MultiWriter(f, h), rng, n); err != nil {
		f.Close()
		return nil, err
	}
	return h.Sum(nil), f.Close()
}

// copySynced copies from to a new file to, fsyncs it and removes it: the disk's share of
// an upload that is durable when it is acknowledged.
func copySynced(from, to string) error {
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.Create(to)
	if err != nil {
		return err
	}
	defer os.Remove(to)
	_, err = io.Copy(dst, src)
	if serr := dst.Sync(); err == nil {
		err = serr
	}
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	return err
}

// hashFloor hashes n bytes of a 1 MiB buffer in memory.
func hashFloor(n int64) error {
	buf := make([]byte, 1<<20)
	h := sha256.New()
	for left := n; left > 0; left -= int64(len(buf)) {
		h.Write(buf[:min(left, int64(len(buf)))])
	}
	h.Sum(nil)
	return nil
}

// sizeName is n in GiB or MiB.
func sizeName(n int64) string {
	if n >= 1<<30 && n%(1<<30) == 0 {
		return fmt.Sprintf("%d GiB", n>>30)
	}
	return fmt.Sprintf("%d MiB", n>>20)
}
