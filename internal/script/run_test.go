package script

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestTransform(t *testing.T) {
	r := newRunner(t, nil)
	tests := []struct {
		name, src, input, want string
		logs                   []string
	}{
		{"reshape", `function transform(input) { return {total: input.items.reduce((a, b) => a + b, 0)} }`,
			`{"items":[1,2,3]}`, `{"total":6}`, nil},
		{"logs", "function transform(input) {\n console.log('got', input.a);\n console.log('x');\n return input.a }",
			`{"a":"b"}`, `"b"`, []string{"got b", "x"}},
		{"no input is null", `function transform(input) { return input === null }`, ``, `true`, nil},
		{"undefined becomes null", `function transform(input) {}`, `1`, `null`, nil},
		{"unicode", `function transform(s) { return s + "\u2028é" }`, `"a\u2028"`, `"a\u2028\u2028é"`, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := run(t, r, tt.src, tt.input)
			if err != nil {
				t.Fatal(err)
			}
			if got := string(res.Result); got != tt.want && got != jsonUnescape(tt.want) {
				t.Errorf("result %s, want %s", got, tt.want)
			}
			if strings.Join(res.Logs, "|") != strings.Join(tt.logs, "|") {
				t.Errorf("logs %q, want %q", res.Logs, tt.logs)
			}
		})
	}
}

// jsonUnescape lets the table name "\u2028" either escaped or raw.
func jsonUnescape(s string) string { return strings.ReplaceAll(s, `\u2028`, "\u2028") }

func TestStateDoesNotCrossRuns(t *testing.T) {
	r := newRunner(t, func(c *Config) { c.Workers = 1 })
	if _, err := run(t, r, `globalThis.secret = 42; function transform() { return 1 }`, ``); err != nil {
		t.Fatal(err)
	}
	res, err := run(t, r, `function transform() { return typeof secret }`, ``)
	if err != nil {
		t.Fatal(err)
	}
	if string(res.Result) != `"undefined"` {
		t.Errorf("a global leaked from the previous run: %s", res.Result)
	}
}

// Runtimes are made ahead, in the background (spareRuntimes per worker): a burst that
// drains them, calls paced so that they refill, and calls with a memory limit of their
// own must each still get a runtime, and its log sink, that no other run has touched.
func TestEveryRunGetsFreshRuntime(t *testing.T) {
	r := newRunner(t, func(c *Config) { c.Workers = 1 })
	src := `function transform(i) { globalThis.runs = (globalThis.runs || 0) + 1; console.log("run " + i); return globalThis.runs }`
	for i := range 3*spareRuntimes + 2 {
		if i >= 2*spareRuntimes {
			time.Sleep(50 * time.Millisecond) // let the worker refill its spares
		}
		req := Request{Source: src, Input: []byte(strconv.Itoa(i))}
		if i%3 == 2 {
			req.MemoryBytes = 32 << 20 // not the default: made on the spot
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		res, err := r.Run(ctx, req)
		cancel()
		if err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
		if string(res.Result) != "1" {
			t.Errorf("run %d saw %s runs in its runtime, want 1: a runtime was reused", i, res.Result)
		}
		if want := []string{"run " + strconv.Itoa(i)}; !slices.Equal(res.Logs, want) {
			t.Errorf("run %d logs %q, want %q", i, res.Logs, want)
		}
	}
}

func TestLogsBounded(t *testing.T) {
	r := newRunner(t, func(c *Config) { c.MaxLogBytes = 100; c.MaxLogLines = 5 })
	for _, src := range []string{
		`function transform() { for (let i = 0; i < 1000; i++) console.log(i) }`,
		`function transform() { console.log("x".repeat(100000)) }`,
	} {
		res, err := run(t, r, src, ``)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, l := range res.Logs[:len(res.Logs)-1] {
			n += len(l)
		}
		if len(res.Logs) > 6 || n > 100 || !strings.Contains(res.Logs[len(res.Logs)-1], "dropped") {
			t.Errorf("logs not bounded: %d lines, %d bytes, last %q", len(res.Logs), n, res.Logs[len(res.Logs)-1])
		}
	}
}

func TestScriptErrors(t *testing.T) {
	r := newRunner(t, nil)
	tests := []struct {
		name, src, input string
		kind, msg        string
		line, col        int
	}{
		{"syntax", "function transform(input) {\n  return {a: ;\n}", ``, KindSyntax, "SyntaxError", 2, 10},
		{"throw", "function transform(input) {\n  if (input.n > 1)\n    throw new RangeError('too big');\n}", `{"n":2}`, KindException, "RangeError: too big", 3, 15},
		{"exception", "function transform(input) {\n  null.x;\n}", `{}`, KindException, "TypeError", 2, 3},
		{"throw string", "function transform() {\n  throw 'nope';\n}", ``, KindException, "nope", 0, 0},
		{"no transform", "const x = 1;", ``, KindException, "must define function transform", 0, 0},
		{"static import", "import * as std from 'std';\nfunction transform() {}", ``, KindSyntax, "SyntaxError", 1, 1},
		{"bad json input", "function transform() {}", `{`, KindInvalid, "not valid JSON", 0, 0},
		{"empty source", "", ``, KindInvalid, "empty", 0, 0},
		{"huge source", strings.Repeat(" ", DefaultMaxSourceBytes+1), ``, KindInvalid, "source", 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := run(t, r, tt.src, tt.input)
			var se *Error
			if !errors.As(err, &se) {
				t.Fatalf("err = %v, want *Error", err)
			}
			if se.Kind != tt.kind || !strings.Contains(se.Message, tt.msg) {
				t.Errorf("got %+v, want kind %s and message with %q", se, tt.kind, tt.msg)
			}
			if tt.line != 0 && (se.Line != tt.line || se.Column != tt.col) {
				t.Errorf("position %d:%d, want %d:%d (%q)", se.Line, se.Column, tt.line, tt.col, se.Message)
			}
			if se.Code() != "script_error" {
				t.Errorf("code %s", se.Code())
			}
		})
	}
}

func TestRequestLimits(t *testing.T) {
	r := newRunner(t, func(c *Config) { c.MaxInputBytes = 10 })
	ctx := context.Background()
	src := `function transform(x) { return x }`
	for name, req := range map[string]Request{
		"input":       {Source: src, Input: []byte(`"0123456789"`)},
		"timeout":     {Source: src, Timeout: DefaultMaxTimeout + 1},
		"memory high": {Source: src, MemoryBytes: DefaultMaxMemoryBytes + 1},
		"memory low":  {Source: src, MemoryBytes: 1000},
	} {
		_, err := r.Run(ctx, req)
		var se *Error
		if !errors.As(err, &se) || se.Kind != KindInvalid {
			t.Errorf("%s: err = %v, want invalid", name, err)
		}
	}
}

func TestDisabled(t *testing.T) {
	r, err := New(context.Background(), Config{Enabled: false})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.Run(context.Background(), Request{Source: "x"}); !errors.Is(err, ErrDisabled) {
		t.Fatalf("err = %v, want ErrDisabled", err)
	}
}

func TestClosed(t *testing.T) {
	r := newRunner(t, nil)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, r, `function transform() {}`, ``); !errors.Is(err, ErrClosed) {
		t.Fatalf("err = %v, want ErrClosed", err)
	}
}
