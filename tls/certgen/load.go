package certgen

import (
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"os"
	"strings"
)

// maxPEMFile bounds what LoadCA reads: real certificates and keys are a few kilobytes.
const maxPEMFile = 1 << 20

// LoadCA reads a CA certificate and its private key (PKCS#8, SEC 1 or PKCS#1 PEM).
func LoadCA(certFile, keyFile string) (*CA, error) {
	certPEM, err := readSmall(certFile)
	if err != nil {
		return nil, err
	}
	keyPEM, err := readSmall(keyFile)
	if err != nil {
		return nil, err
	}
	return parseCA(certPEM, keyPEM)
}

func parseCA(certPEM, keyPEM []byte) (*CA, error) {
	cert, err := parseCertPEM(certPEM)
	if err != nil {
		return nil, err
	}
	if !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, ErrNotCA
	}
	key, err := parseKeyPEM(keyPEM)
	if err != nil {
		return nil, err
	}
	if !publicKeyMatches(cert, key) {
		return nil, ErrKeyMismatch
	}
	return &CA{Cert: cert, Key: key, CertPEM: certPEM, KeyPEM: keyPEM}, nil
}

// Fingerprint returns the SHA-256 of the first certificate's DER in the "AB:CD:…" form
// that openssl and browsers print.
func Fingerprint(certPEM []byte) (string, error) {
	cert, err := parseCertPEM(certPEM)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(cert.Raw)
	var b strings.Builder
	for i, c := range sum {
		if i > 0 {
			b.WriteByte(':')
		}
		fmt.Fprintf(&b, "%02X", c)
	}
	return b.String(), nil
}

func readSmall(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("certgen: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxPEMFile+1))
	if err != nil {
		return nil, fmt.Errorf("certgen: read %s: %w", name, err)
	}
	if len(data) > maxPEMFile {
		return nil, fmt.Errorf("certgen: %s is larger than %d bytes", name, maxPEMFile)
	}
	return data, nil
}

func parseCertPEM(data []byte) (*x509.Certificate, error) {
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			return nil, fmt.Errorf("%w: CERTIFICATE", ErrNoPEM)
		}
		if block.Type == "CERTIFICATE" {
			cert, err := x509.ParseCertificate(block.Bytes)
			if err != nil {
				return nil, fmt.Errorf("certgen: parse certificate: %w", err)
			}
			return cert, nil
		}
	}
}

func parseKeyPEM(data []byte) (crypto.Signer, error) {
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			return nil, fmt.Errorf("%w: PRIVATE KEY", ErrNoPEM)
		}
		var key any
		var err error
		switch block.Type {
		case "PRIVATE KEY":
			key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
		case "EC PRIVATE KEY":
			key, err = x509.ParseECPrivateKey(block.Bytes)
		case "RSA PRIVATE KEY":
			key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
		default:
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("certgen: parse private key: %w", err)
		}
		signer, ok := key.(crypto.Signer)
		if !ok {
			return nil, fmt.Errorf("certgen: unsupported private key type %T", key)
		}
		return signer, nil
	}
}

func publicKeyMatches(cert *x509.Certificate, key crypto.Signer) bool {
	pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool })
	return ok && pub.Equal(cert.PublicKey)
}
