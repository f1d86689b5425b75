package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
)

func init() {
	register("token", command{summary: "print a new random 256-bit token for SIDECAR_AUTH_TOKEN",
		usage: "usage: sidecar token [-o text|json]\n\nPrints a new random 256-bit token (base64url, 43 characters) for SIDECAR_AUTH_TOKEN.",
		run:   runToken})
}

// newToken is 32 random bytes, base64url without padding: 43 characters.
func newToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return base64.RawURLEncoding.EncodeToString(b)
}

func runToken(_ context.Context, args []string) error {
	fs := newLocalFlagSet("token")
	output := outputFlag(fs, "text", "json")
	if _, err := operands(fs, args, 0, "usage: sidecar token [-o text|json]"); err != nil {
		return err
	}
	if output.json() {
		return printJSON(os.Stdout, map[string]string{"token": newToken()})
	}
	fmt.Println(newToken())
	return nil
}
