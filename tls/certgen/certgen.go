// Package certgen makes the certificates sidecar needs: a private CA, server and client
// certificates it issues, and a self-signed pair for development. Keys are ECDSA P-256.
//
// It uses only the standard library so that the client can import it without pulling in
// anything of the daemon.
package certgen

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"strings"
	"time"
)

// Default lifetimes, used when a caller passes a lifetime of zero or less.
const (
	DefaultCALifetime = 10 * 365 * 24 * time.Hour
	// DefaultLeafLifetime is 397 days: the longest lifetime browsers and Apple platforms
	// accept for a server certificate, and a yearly renewal with a month to spare.
	DefaultLeafLifetime = 397 * 24 * time.Hour
	// MaxHosts bounds the subject alternative names of one certificate.
	MaxHosts = 100
)

// backdate absorbs clock skew between the issuing host and its peers.
const backdate = 5 * time.Minute

// Sentinel errors; wrap them with %w so callers can test with errors.Is.
var (
	ErrNoHosts      = errors.New("certgen: at least one host name or IP address is required")
	ErrTooManyHosts = fmt.Errorf("certgen: more than %d hosts", MaxHosts)
	ErrInvalidHost  = errors.New("certgen: invalid host name")
	ErrInvalidName  = errors.New("certgen: invalid client name")
	ErrNotCA        = errors.New("certgen: certificate is not a CA")
	ErrKeyMismatch  = errors.New("certgen: private key does not match certificate")
	ErrNoPEM        = errors.New("certgen: no PEM block of the expected type")
)

// CA is a certificate authority that can issue server and client certificates.
type CA struct {
	Cert    *x509.Certificate
	Key     crypto.Signer
	CertPEM []byte
	KeyPEM  []byte
}

// NewCA makes a private CA with a fresh P-256 key. It may sign leaf certificates only
// (path length zero).
func NewCA(commonName string, lifetime time.Duration) (*CA, error) {
	if commonName == "" {
		commonName = "sidecar CA"
	}
	if lifetime <= 0 {
		lifetime = DefaultCALifetime
	}
	key, err := newKey()
	if err != nil {
		return nil, err
	}
	tmpl, err := template(commonName, lifetime)
	if err != nil {
		return nil, err
	}
	tmpl.IsCA = true
	tmpl.BasicConstraintsValid = true
	tmpl.MaxPathLenZero = true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature
	certPEM, keyPEM, err := sign(tmpl, tmpl, key, key)
	if err != nil {
		return nil, err
	}
	return parseCA(certPEM, keyPEM)
}

// IssueServer issues a server certificate for hosts (DNS names or IP addresses).
func (ca *CA) IssueServer(hosts []string, lifetime time.Duration) (certPEM, keyPEM []byte, err error) {
	tmpl, err := serverTemplate(hosts, lifetime)
	if err != nil {
		return nil, nil, err
	}
	key, err := newKey()
	if err != nil {
		return nil, nil, err
	}
	return sign(tmpl, ca.Cert, key, ca.Key)
}

// IssueClient issues a client certificate for mTLS whose common name is name.
func (ca *CA) IssueClient(name string, lifetime time.Duration) (certPEM, keyPEM []byte, err error) {
	if name == "" || len(name) > 64 || strings.ContainsFunc(name, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return nil, nil, fmt.Errorf("%w: %q", ErrInvalidName, name)
	}
	if lifetime <= 0 {
		lifetime = DefaultLeafLifetime
	}
	tmpl, err := template(name, lifetime)
	if err != nil {
		return nil, nil, err
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	key, err := newKey()
	if err != nil {
		return nil, nil, err
	}
	return sign(tmpl, ca.Cert, key, ca.Key)
}

// SelfSigned makes a server certificate that is its own CA, so that a client can pin the
// certificate file itself (SANDBOX_REMOTE_CA_FILE). For development only.
func SelfSigned(hosts []string, lifetime time.Duration) (certPEM, keyPEM []byte, err error) {
	tmpl, err := serverTemplate(hosts, lifetime)
	if err != nil {
		return nil, nil, err
	}
	// Clients verify the chain with this certificate as the trust anchor, which OpenSSL
	// and Go accept only from a CA certificate allowed to sign.
	tmpl.IsCA = true
	tmpl.BasicConstraintsValid = true
	tmpl.MaxPathLenZero = true
	tmpl.KeyUsage |= x509.KeyUsageCertSign
	key, err := newKey()
	if err != nil {
		return nil, nil, err
	}
	return sign(tmpl, tmpl, key, key)
}

func serverTemplate(hosts []string, lifetime time.Duration) (*x509.Certificate, error) {
	if len(hosts) == 0 {
		return nil, ErrNoHosts
	}
	if len(hosts) > MaxHosts {
		return nil, ErrTooManyHosts
	}
	if lifetime <= 0 {
		lifetime = DefaultLeafLifetime
	}
	tmpl, err := template(hosts[0], lifetime)
	if err != nil {
		return nil, err
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			continue
		}
		if !validDNSName(h) {
			return nil, fmt.Errorf("%w: %q", ErrInvalidHost, h)
		}
		tmpl.DNSNames = append(tmpl.DNSNames, strings.ToLower(h))
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	return tmpl, nil
}

// validDNSName accepts host names of letters, digits, hyphens and dots, with an optional
// leading "*." wildcard label.
func validDNSName(h string) bool {
	h = strings.TrimPrefix(h, "*.")
	if h == "" || len(h) > 253 {
		return false
	}
	for label := range strings.SplitSeq(h, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

func template(commonName string, lifetime time.Duration) (*x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("certgen: serial number: %w", err)
	}
	now := time.Now()
	return &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: commonName, Organization: []string{"sidecar"}},
		NotBefore:    now.Add(-backdate),
		NotAfter:     now.Add(lifetime),
	}, nil
}

func newKey() (*ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("certgen: generate key: %w", err)
	}
	return key, nil
}

// sign creates tmpl signed by parent's key and returns it with key, both PEM-encoded.
func sign(tmpl, parent *x509.Certificate, key *ecdsa.PrivateKey, parentKey crypto.Signer) (certPEM, keyPEM []byte, err error) {
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, key.Public(), parentKey)
	if err != nil {
		return nil, nil, fmt.Errorf("certgen: create certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("certgen: marshal key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), nil
}
