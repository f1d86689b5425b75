package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

func init() {
	register("script", command{summary: "run a JavaScript transform on the daemon (script run FILE.js --input IN.json)",
		usage: scriptUsage + "\n\nPrints the transform's result as JSON and its console output on stderr.",
		subs:  []string{"run"}, run: runScript})
}

const scriptUsage = "usage: sidecar script run FILE.js [--input IN.json|-] [--timeout 5s] [--lease-token TOKEN] [-o json]"

// scriptArgs are the parsed arguments of `script run`.
type scriptArgs struct {
	file, input, leaseToken string
	timeout                 time.Duration
}

func parseScript(args []string) (scriptArgs, error) {
	if len(args) == 0 || args[0] != "run" {
		return scriptArgs{}, usageError{scriptUsage}
	}
	fs := newFlagSet("script run", commands["script"].usage)
	var a scriptArgs
	fs.StringVar(&a.input, "input", "", "JSON input file (- for stdin; empty: null)")
	fs.StringVar(&a.leaseToken, "lease-token", "", "authenticate with a lease token instead of the shared token")
	fs.DurationVar(&a.timeout, "timeout", 0, "script time limit (0: the daemon's default)")
	outputFlag(fs, "json") // the result is JSON; -o json is accepted for uniformity
	pos, err := operands(fs, args[1:], 1, scriptUsage)
	if err != nil {
		return a, err
	}
	if a.timeout < 0 {
		return a, usagef("--timeout %v: must not be negative", a.timeout)
	}
	a.file = pos[0]
	return a, nil
}

func runScript(ctx context.Context, args []string) error {
	a, err := parseScript(args)
	if err != nil {
		return err
	}
	src, err := os.ReadFile(a.file)
	if err != nil {
		return err
	}
	input := json.RawMessage("null")
	if a.input != "" {
		var raw []byte
		if a.input == "-" {
			raw, err = io.ReadAll(os.Stdin)
		} else {
			raw, err = os.ReadFile(a.input)
		}
		if err != nil {
			return err
		}
		if !json.Valid(raw) {
			return fmt.Errorf("--input %s is not valid JSON", a.input)
		}
		input = raw
	}
	c, err := newClient(a.leaseToken)
	if err != nil {
		return err
	}
	res, err := c.RunScript(ctx, apitype.ScriptRequest{Source: string(src), Input: input, TimeoutMS: a.timeout.Milliseconds()})
	if err != nil {
		return err
	}
	for _, line := range res.Logs {
		fmt.Fprintln(os.Stderr, line)
	}
	return printJSON(os.Stdout, res.Result)
}
