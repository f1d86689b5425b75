// Package tlsconfig builds the TLS configurations of the daemon and the client, and keeps
// the daemon's certificate fresh: reloaded on SIGHUP (Reload) or when the files change
// (Watch), without dropping connections.
//
// It uses only the standard library so that the client can import it.
package tlsconfig

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"syscall"
	"time"
)

// ExpiryWarning is how close to expiry a certificate gets logged as a warning.
const ExpiryWarning = 30 * 24 * time.Hour

// ErrNoCertificate is returned when a key pair holds no usable leaf certificate.
var ErrNoCertificate = errors.New("tlsconfig: no certificate in key pair")

// Reloader holds the daemon's current certificate. Handshakes read it through
// GetCertificate, so a reload reaches new connections only; open ones keep the certificate
// they were made with.
type Reloader struct {
	certFile, keyFile string
	logger            *slog.Logger

	mu       sync.RWMutex
	cert     *tls.Certificate
	loadedAt stamp // the files as they were when cert was read
}

// stamp identifies a version of both files without reading them. Inode and device catch
// a renamed-over file (atomic writes, Kubernetes secret symlink swaps) even when size and
// mtime happen to match.
type stamp struct{ cert, key fileStamp }

type fileStamp struct {
	dev, ino uint64
	size     int64
	mtime    time.Time
}

func statFiles(certFile, keyFile string) (stamp, error) {
	c, err := statFile(certFile)
	if err != nil {
		return stamp{}, err
	}
	k, err := statFile(keyFile)
	if err != nil {
		return stamp{}, err
	}
	return stamp{c, k}, nil
}

func statFile(name string) (fileStamp, error) {
	fi, err := os.Stat(name) // follows symlinks: the target is what gets loaded
	if err != nil {
		return fileStamp{}, err
	}
	s := fileStamp{size: fi.Size(), mtime: fi.ModTime()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		s.dev, s.ino = uint64(st.Dev), st.Ino
	}
	return s, nil
}

// NewReloader loads the pair once; it fails if the pair is unusable.
func NewReloader(certFile, keyFile string, logger *slog.Logger) (*Reloader, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	r := &Reloader{certFile: certFile, keyFile: keyFile, logger: logger}
	if err := r.Reload(); err != nil {
		return nil, err
	}
	return r, nil
}

// Reload reads the pair again. A pair that does not load (missing, mismatched, half
// written) leaves the current certificate in place and returns the error.
func (r *Reloader) Reload() error {
	// Stamp before reading: if the files change while being read, the next Watch tick
	// sees a different stamp and reads them again.
	st, err := statFiles(r.certFile, r.keyFile)
	if err != nil {
		return fmt.Errorf("tlsconfig: %w", err)
	}
	cert, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		return fmt.Errorf("tlsconfig: load %s: %w", r.certFile, err)
	}
	if cert.Leaf == nil {
		return ErrNoCertificate
	}
	r.mu.Lock()
	r.cert, r.loadedAt = &cert, st
	r.mu.Unlock()

	leaf := cert.Leaf
	r.logger.Info("tls certificate loaded", "file", r.certFile, "subject", leaf.Subject.CommonName,
		"not_after", leaf.NotAfter, "dns_names", leaf.DNSNames, "ip_addresses", leaf.IPAddresses)
	r.warnIfExpiring(time.Now())
	return nil
}

func (r *Reloader) warnIfExpiring(now time.Time) {
	notAfter := r.NotAfter()
	if left := notAfter.Sub(now); left < ExpiryWarning {
		r.logger.Warn("tls certificate expires soon", "file", r.certFile,
			"not_after", notAfter, "days_left", int(left.Hours()/24))
	}
}

// Watch polls the files every interval (mtime, size, inode) and reloads when they change,
// until ctx is done. A change that fails to load is logged and not retried until the files
// change again. It also repeats the expiry warning once a day.
func (r *Reloader) Watch(ctx context.Context, every time.Duration) {
	if every <= 0 {
		every = 10 * time.Second
	}
	r.mu.RLock()
	seen := r.loadedAt
	r.mu.RUnlock()
	lastWarn := time.Now()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if now.Sub(lastWarn) >= 24*time.Hour {
				r.warnIfExpiring(now)
				lastWarn = now
			}
			st, err := statFiles(r.certFile, r.keyFile)
			if err != nil || st == seen {
				continue // a missing file is usually a replacement in progress
			}
			seen = st
			if err := r.Reload(); err != nil {
				r.logger.Error("tls certificate reload failed; keeping the current one", "err", err)
			}
		}
	}
}

// NotAfter is the expiry of the current certificate, for the expiry metric.
func (r *Reloader) NotAfter() time.Time {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.cert.Leaf.NotAfter
}

// GetCertificate returns the current certificate; it is meant for tls.Config.
func (r *Reloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.cert, nil
}
