package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
)

func init() {
	register("token", command{summary: "print a new random 256-bit token for SIDECAR_AUTH_TOKEN", run: runToken})
}

// newToken is 32 random bytes, base64url without padding: 43 characters.
func newToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return base64.RawURLEncoding.EncodeToString(b)
}

func runToken(_ context.Context, args []string) error {
	if len(args) > 0 {
		return errors.New("usage: sidecar token")
	}
	fmt.Println(newToken())
	return nil
}
