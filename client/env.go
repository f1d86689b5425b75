package client

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// Client environment variables of the wire contract.
const (
	EnvProvider       = "SANDBOX_PROVIDER"
	EnvURL            = "SANDBOX_REMOTE_URL"
	EnvDiscovery      = "SANDBOX_REMOTE_DISCOVERY"
	EnvToken          = "SANDBOX_REMOTE_AUTH_TOKEN"
	EnvTokenFile      = "SANDBOX_REMOTE_AUTH_TOKEN_FILE"
	EnvCAFile         = "SANDBOX_REMOTE_CA_FILE"
	EnvClientCertFile = "SANDBOX_REMOTE_CLIENT_CERT_FILE"
	EnvClientKeyFile  = "SANDBOX_REMOTE_CLIENT_KEY_FILE"
	// EnvScriptEnabled=false turns script calls off on the client side too (the daemon
	// reads the same variable).
	EnvScriptEnabled = "SCRIPT_ENABLED"
)

// ProviderRemote is the SANDBOX_PROVIDER value that enables sidecar sandboxes.
const ProviderRemote = "remote"

// MinTokenLength is the shortest shared token the daemon accepts.
const MinTokenLength = apitype.MinTokenLength

// ConfigFromEnv reads the SANDBOX_* variables. Every problem is reported at once, each
// naming its variable; the token's value never appears in an error.
func ConfigFromEnv() (Config, error) { return configFromLookup(os.LookupEnv) }

func configFromLookup(lookup func(string) (string, bool)) (Config, error) {
	return remoteConfig(lookup, true)
}

// HostConfigFromEnv is ConfigFromEnv for operator commands on the daemon's host: it needs
// the URL and a token but not SANDBOX_PROVIDER, which says whether an app uses sandboxes,
// not whether an operator may reach the daemon.
func HostConfigFromEnv() (Config, error) { return remoteConfig(os.LookupEnv, false) }

// remoteConfig reads the SANDBOX_REMOTE_* variables and, when needProvider, insists on
// SANDBOX_PROVIDER=remote.
func remoteConfig(lookup func(string) (string, bool), needProvider bool) (Config, error) {
	get := func(k string) string { v, _ := lookup(k); return strings.TrimSpace(v) }
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }

	if p := get(EnvProvider); needProvider && p != ProviderRemote {
		bad("%s must be \"remote\" (got %q)", EnvProvider, p)
	}
	var cfg Config
	switch raw := get(EnvURL); {
	case raw == "":
		bad("%s is required", EnvURL)
	default:
		// A comma-separated list names several sidecars (a fleet); each must be good.
		ok := true
		for _, one := range strings.Split(raw, ",") {
			one = strings.TrimSpace(one)
			u, err := url.Parse(one)
			switch {
			case one == "":
				bad("%s has an empty entry in its list", EnvURL)
			case err != nil:
				bad("%s is not a URL", EnvURL)
			case u.Scheme != "https":
				bad("%s must be an https:// URL (got scheme %q)", EnvURL, u.Scheme)
			case u.Host == "":
				bad("%s has no host", EnvURL)
			default:
				continue
			}
			ok = false
		}
		if ok {
			cfg.URL = raw
		}
	}
	switch d := get(EnvDiscovery); d {
	case "":
	case DiscoveryDNS:
		if strings.Contains(get(EnvURL), ",") {
			bad("%s=dns takes one URL (a name), not a list", EnvDiscovery)
		}
		cfg.Discovery = d
	default:
		bad("%s must be %q or unset (got %q)", EnvDiscovery, DiscoveryDNS, d)
	}

	token, tokenFile := get(EnvToken), get(EnvTokenFile)
	switch {
	case token != "" && tokenFile != "":
		bad("set only one of %s and %s", EnvToken, EnvTokenFile)
	case tokenFile != "":
		b, err := os.ReadFile(tokenFile)
		if err != nil {
			bad("%s: %v", EnvTokenFile, unwrapPathError(err))
			break
		}
		token = strings.TrimSpace(string(b))
		if token == "" {
			bad("%s: %s is empty", EnvTokenFile, tokenFile)
		}
	case token == "":
		bad("%s or %s is required", EnvToken, EnvTokenFile)
	}
	if token != "" {
		if n := len(token); n < MinTokenLength {
			bad("the auth token is %d characters; at least %d are required", n, MinTokenLength)
		} else {
			cfg.Token = token
		}
	}

	cfg.CAFile = get(EnvCAFile)
	cfg.CertFile = get(EnvClientCertFile)
	cfg.KeyFile = get(EnvClientKeyFile)
	for _, f := range []struct{ name, path string }{
		{EnvCAFile, cfg.CAFile}, {EnvClientCertFile, cfg.CertFile}, {EnvClientKeyFile, cfg.KeyFile},
	} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			bad("%s: %v", f.name, unwrapPathError(err))
		}
	}
	if (cfg.CertFile == "") != (cfg.KeyFile == "") {
		bad("%s and %s go together", EnvClientCertFile, EnvClientKeyFile)
	}
	if len(errs) > 0 {
		return Config{}, fmt.Errorf("client configuration: %w", errors.Join(errs...))
	}
	return cfg, nil
}

// unwrapPathError keeps "open /x: no such file" readable without repeating the variable.
func unwrapPathError(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s: %w", pe.Path, pe.Err)
	}
	return err
}
