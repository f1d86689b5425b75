package client

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestConfigFromEnv(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(testToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	ok := map[string]string{EnvProvider: "remote", EnvURL: "https://127.0.0.1:7443", EnvToken: testToken}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range ok {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			if kv[i+1] == "" {
				delete(m, kv[i])
			} else {
				m[kv[i]] = kv[i+1]
			}
		}
		return m
	}
	tests := []struct {
		name    string
		env     map[string]string
		wantErr []string // substrings, all of them
	}{
		{"ok", ok, nil},
		{"token file", with(EnvToken, "", EnvTokenFile, tokenFile, EnvCAFile, caFile), nil},
		{"wrong provider", with(EnvProvider, "local"), []string{EnvProvider}},
		{"http url", with(EnvURL, "http://127.0.0.1:7443"), []string{EnvURL, "https"}},
		{"no url", with(EnvURL, ""), []string{EnvURL + " is required"}},
		{"short token", with(EnvToken, "short-secret"), []string{"12 characters"}},
		{"no token", with(EnvToken, ""), []string{EnvToken}},
		{"both tokens", with(EnvTokenFile, tokenFile), []string{"only one"}},
		{"missing token file", with(EnvToken, "", EnvTokenFile, filepath.Join(dir, "nope")), []string{EnvTokenFile, "no such file"}},
		{"missing ca", with(EnvCAFile, filepath.Join(dir, "nope.pem")), []string{EnvCAFile}},
		{"cert without key", with(EnvClientCertFile, caFile), []string{"go together"}},
		{"all at once", map[string]string{EnvProvider: "docker", EnvURL: "ftp://x", EnvToken: "tiny"},
			[]string{EnvProvider, EnvURL, "4 characters"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := configFromLookup(func(k string) (string, bool) { v, ok := tt.env[k]; return v, ok })
			if tt.wantErr == nil {
				if err != nil {
					t.Fatal(err)
				}
				if cfg.Token != testToken || cfg.URL == "" {
					t.Fatalf("cfg = %+v", cfg)
				}
				return
			}
			if err == nil {
				t.Fatal("no error")
			}
			for _, s := range tt.wantErr {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q lacks %q", err, s)
				}
			}
			for _, secret := range []string{"short-secret", "tiny", testToken} {
				if strings.Contains(err.Error(), secret) {
					t.Errorf("error echoes the token: %q", err)
				}
			}
		})
	}
}

func TestNewRefusesPlainHTTP(t *testing.T) {
	if _, err := New(Config{URL: "http://127.0.0.1:7443"}); err == nil {
		t.Fatal("http URL accepted")
	}
}
