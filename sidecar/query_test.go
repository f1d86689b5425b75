package sidecar

import (
	"net/url"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// query reads every parameter of a handler and keeps the first malformed one as a 400
// naming it; absent parameters are zero.
func TestQueryKeepsFirstError(t *testing.T) {
	v, _ := url.ParseQuery("max_depth=3&hidden=1&glob=a&glob=b&timeout_ms=1500&limit=x&context=-2")
	q := query{Values: v}
	tree := q.tree()
	if tree.MaxDepth != 3 || !tree.Hidden || tree.GitIgnore || len(tree.Include) != 2 || q.timeout() != 1500*time.Millisecond {
		t.Fatalf("tree %+v timeout %v", tree, q.timeout())
	}
	if q.err != nil || q.int("absent") != 0 {
		t.Fatalf("err %v before any malformed parameter", q.err)
	}
	q.int("limit")
	q.int("context")
	p := problemOf(q.err)
	if p.Status != 400 || p.Code != apitype.CodeInvalidRequest || p.Detail != "limit must be a non-negative integer" {
		t.Fatalf("problem %+v, want 400 naming limit (the first malformed one)", p)
	}
}
