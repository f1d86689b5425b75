package certgen

import (
	"bytes"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// File names EnsureSelfSigned keeps in its directory.
const (
	SelfSignedCertName = "tls-self-signed.crt"
	SelfSignedKeyName  = "tls-self-signed.key"
)

// RenewBefore is how long before expiry EnsureSelfSigned replaces a pair, so that a daemon
// never starts with a certificate about to lapse.
const RenewBefore = 30 * 24 * time.Hour

// EnsureSelfSigned keeps a self-signed pair for hosts in dir (SIDECAR_TLS_SELF_SIGNED): it
// reuses the pair there when it parses, matches, covers every host and is not within
// RenewBefore of expiry, and otherwise makes a new one. The key is written 0600 and the
// certificate 0644, each atomically, key first: a crash in between leaves a mismatched
// pair, which the next call replaces.
func EnsureSelfSigned(dir string, hosts []string) (certFile, keyFile string, created bool, err error) {
	if _, err := serverTemplate(hosts, 0); err != nil {
		return "", "", false, err
	}
	certFile = filepath.Join(dir, SelfSignedCertName)
	keyFile = filepath.Join(dir, SelfSignedKeyName)
	if reusable(certFile, keyFile, hosts, time.Now()) {
		// A key made looser by hand is tightened rather than thrown away.
		if err := os.Chmod(keyFile, 0o600); err != nil {
			return "", "", false, fmt.Errorf("certgen: %w", err)
		}
		return certFile, keyFile, false, nil
	}
	certPEM, keyPEM, err := SelfSigned(hosts, 0)
	if err != nil {
		return "", "", false, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", false, fmt.Errorf("certgen: %w", err)
	}
	if err := writeFileAtomic(keyFile, keyPEM, 0o600); err != nil {
		return "", "", false, err
	}
	if err := writeFileAtomic(certFile, certPEM, 0o644); err != nil {
		return "", "", false, err
	}
	return certFile, keyFile, true, nil
}

func reusable(certFile, keyFile string, hosts []string, now time.Time) bool {
	certPEM, err := readSmall(certFile)
	if err != nil {
		return false
	}
	keyPEM, err := readSmall(keyFile)
	if err != nil {
		return false
	}
	cert, err := parseCertPEM(certPEM)
	if err != nil {
		return false
	}
	key, err := parseKeyPEM(keyPEM)
	if err != nil || !publicKeyMatches(cert, key) {
		return false
	}
	if now.Before(cert.NotBefore) || now.Add(RenewBefore).After(cert.NotAfter) {
		return false
	}
	for _, h := range hosts {
		if !lists(cert, h) {
			return false
		}
	}
	return true
}

// lists reports whether cert names h exactly among its subject alternative names.
func lists(cert *x509.Certificate, h string) bool {
	if ip := net.ParseIP(h); ip != nil {
		return slices.ContainsFunc(cert.IPAddresses, ip.Equal)
	}
	return slices.Contains(cert.DNSNames, strings.ToLower(h))
}

// writeFileAtomic writes data so that readers see the old file or the whole new one:
// temporary file in the same directory, fsync, rename, fsync of the directory.
func writeFileAtomic(name string, data []byte, perm os.FileMode) (err error) {
	dir := filepath.Dir(name)
	f, err := os.CreateTemp(dir, "."+filepath.Base(name)+".tmp*")
	if err != nil {
		return fmt.Errorf("certgen: %w", err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
			err = fmt.Errorf("certgen: write %s: %w", name, err)
		}
	}()
	if err = f.Chmod(perm); err != nil {
		return err
	}
	if _, err = bytes.NewReader(data).WriteTo(f); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(f.Name(), name); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
