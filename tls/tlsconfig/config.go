package tlsconfig

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// ErrNoCACertificates is returned for a CA file that holds no PEM certificate.
var ErrNoCACertificates = errors.New("tlsconfig: no certificates in CA file")

// ErrIncompleteKeyPair is returned when only one of a client certificate and key is given.
var ErrIncompleteKeyPair = errors.New("tlsconfig: client certificate and key must be given together")

// cipherSuites are the TLS 1.2 suites allowed: forward-secret AEADs only. TLS 1.3 suites are
// not configurable and all fine.
var cipherSuites = []uint16{
	tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
	tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
}

// curves puts the post-quantum hybrid first for TLS 1.3 peers that offer it, then X25519
// and P-256.
var curves = []tls.CurveID{tls.X25519MLKEM768, tls.X25519, tls.CurveP256}

// Server returns the daemon's TLS configuration: TLS 1.2 minimum (1.3 is chosen whenever
// the client offers it), AEAD suites, h2 and http/1.1 by ALPN, and the certificate from r.
// A non-empty clientCAFile turns on mTLS: every client must present a certificate issued
// by one of its CAs.
func Server(r *Reloader, clientCAFile string) (*tls.Config, error) {
	cfg := &tls.Config{
		MinVersion:       tls.VersionTLS12,
		CipherSuites:     cipherSuites,
		CurvePreferences: curves,
		NextProtos:       []string{"h2", "http/1.1"},
		GetCertificate:   r.GetCertificate,
	}
	if clientCAFile != "" {
		pool, err := loadPool(clientCAFile)
		if err != nil {
			return nil, err
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// Client returns the Go client's TLS configuration: server verified against caFile (the
// system roots when it is ""), TLS 1.2 minimum, and a client certificate when certFile and
// keyFile are given (mTLS).
func Client(caFile, certFile, keyFile string) (*tls.Config, error) {
	cfg := &tls.Config{
		MinVersion:       tls.VersionTLS12,
		CipherSuites:     cipherSuites,
		CurvePreferences: curves,
	}
	if caFile != "" {
		pool, err := loadPool(caFile)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	if (certFile == "") != (keyFile == "") {
		return nil, ErrIncompleteKeyPair
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("tlsconfig: client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

func loadPool(caFile string) (*x509.CertPool, error) {
	data, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("tlsconfig: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("%w: %s", ErrNoCACertificates, caFile)
	}
	return pool, nil
}
