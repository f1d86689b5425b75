package daemon_test

import (
	"bytes"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/docs"
)

// contractCheck is an http.RoundTripper that validates every reply the e2e suites
// receive against docs/openapi.yaml; the test fails at cleanup with every mismatch.
// Websocket upgrades do not pass through it (their framing is in docs/api.md).
type contractCheck struct {
	next http.RoundTripper
	v    *contractValidator
}

// contractValidator is one validator per test, its failures collected for t.Cleanup (a
// background lease renewal may answer after the test has ended).
type contractValidator struct {
	mu       sync.Mutex // the validator is not documented as safe for concurrent use
	v        validator.Validator
	failures []string
	checked  int
}

func newContractValidator(t testing.TB) *contractValidator {
	t.Helper()
	doc, err := libopenapi.NewDocument(docs.OpenAPI)
	if err != nil {
		t.Fatalf("docs/openapi.yaml: %v", err)
	}
	v, errs := validator.NewValidator(doc)
	if len(errs) > 0 {
		t.Fatalf("docs/openapi.yaml: %v", errs)
	}
	cv := &contractValidator{v: v}
	t.Cleanup(func() {
		cv.mu.Lock()
		defer cv.mu.Unlock()
		for _, f := range cv.failures {
			t.Errorf("reply does not match docs/openapi.yaml: %s", f)
		}
	})
	return cv
}

// wrap validates the replies next receives; a nil validator (the fault suite's ad-hoc
// daemons) leaves next as it is.
func (cv *contractValidator) wrap(next http.RoundTripper) http.RoundTripper {
	if cv == nil {
		return next
	}
	return &contractCheck{next: next, v: cv}
}

func (c *contractCheck) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.next.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	if f := c.v.check(req, resp); f != "" {
		c.v.mu.Lock()
		c.v.failures = append(c.v.failures, f)
		c.v.mu.Unlock()
	}
	return resp, nil
}

// maxValidatedBody bounds how much of a JSON reply is buffered for validation.
const maxValidatedBody = 16 << 20

// check validates one reply and says what is wrong with it ("" when nothing is).
func (cv *contractValidator) check(req *http.Request, resp *http.Response) string {
	what := fmt.Sprintf("%s %s → %d", req.Method, req.URL.Path, resp.StatusCode)
	if resp.StatusCode == http.StatusRequestHeaderFieldsTooLarge {
		return "" // Go's server answers before any route, in plain text (documented)
	}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	isJSON := mt == "application/json" || mt == apitype.ProblemContentType
	// The validator sees JSON bodies whole; other bodies (files, tar, metrics) stream to
	// the caller untouched and are checked for status, headers and media type only.
	var body []byte
	if isJSON && req.Method != http.MethodHead {
		b, err := io.ReadAll(io.LimitReader(resp.Body, maxValidatedBody+1))
		resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(b))
		if err != nil {
			return what + ": reading the body: " + err.Error()
		}
		if len(b) > maxValidatedBody {
			return what + ": JSON body over the validation bound"
		}
		body = b
	}
	vresp := *resp
	vresp.Body = io.NopCloser(bytes.NewReader(body))
	vreq := req.Clone(req.Context())
	vreq.URL.Path, vreq.URL.RawPath = documentedPath(req.URL.Path), ""

	cv.mu.Lock()
	defer cv.mu.Unlock()
	cv.checked++
	ok, errs := cv.v.ValidateHttpResponse(vreq, &vresp)
	if ok {
		return ""
	}
	if len(errs) > 0 && errs[0].ValidationType == "path" {
		// Not a documented operation: the contract answers it with a 404 or 405 problem.
		if (resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed) &&
			(mt == apitype.ProblemContentType || req.Method == http.MethodHead) {
			return ""
		}
	}
	var msgs []string
	for _, e := range errs {
		m := e.Message
		if e.Reason != "" {
			m += " (" + e.Reason + ")"
		}
		for _, se := range e.SchemaValidationErrors {
			m += "; " + se.Reason + " at " + se.FieldPath
		}
		msgs = append(msgs, m)
	}
	return what + ": " + strings.Join(msgs, "; ") + "; body " + truncate(string(body), 300)
}

// documentedPath maps a request path onto the document's: the daemon's {path...} spans
// segments, OpenAPI's {path} does not, so the file path is folded into one segment.
func documentedPath(p string) string {
	rest, ok := strings.CutPrefix(p, "/v1/leases/")
	if !ok {
		return p
	}
	id, tail, _ := strings.Cut(rest, "/")
	if ports, ok := strings.CutPrefix(tail, "ports/"); ok {
		port, file, _ := strings.Cut(ports, "/")
		if file = strings.ReplaceAll(file, "/", "_"); file == "" {
			file = "_"
		}
		return "/v1/leases/" + id + "/ports/" + port + "/" + file
	}
	for _, kind := range []string{"files/", "archive/", "find/", "grep/", "stat/", "watch/"} {
		if file, ok := strings.CutPrefix(tail, kind); ok {
			file = strings.ReplaceAll(file, "/", "_")
			if file == "" {
				file = "_"
			}
			return "/v1/leases/" + id + "/" + kind + file
		}
	}
	return p
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// A reply the document does not describe fails the check: the validator is not a no-op.
func TestContractCheckCatchesMismatches(t *testing.T) {
	cv := &contractValidator{}
	doc, err := libopenapi.NewDocument(docs.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	v, errs := validator.NewValidator(doc)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	cv.v = v
	reply := func(status int, ct, body string) *http.Response {
		return &http.Response{StatusCode: status, Header: http.Header{"Content-Type": {ct}}, Body: io.NopCloser(strings.NewReader(body))}
	}
	req := func(method, path string) *http.Request {
		r, _ := http.NewRequest(method, "https://127.0.0.1:7443"+path, nil)
		return r
	}
	good := `{"exit_code":0,"stdout":"","stderr":"","stdout_truncated":false,"stderr_truncated":false,"stdout_dropped":0,"stderr_dropped":0,"stdout_dropped_at":0,"stderr_dropped_at":0,"timed_out":false,"oom_killed":false,"duration_ms":1}`
	if f := cv.check(req("POST", "/v1/leases/L1/exec"), reply(200, "application/json", good)); f != "" {
		t.Fatalf("a valid exec result failed: %s", f)
	}
	for name, c := range map[string]struct {
		req  *http.Request
		resp *http.Response
	}{
		"missing field":        {req("POST", "/v1/leases/L1/exec"), reply(200, "application/json", `{"exit_code":0}`)},
		"wrong type":           {req("GET", "/v1/leases"), reply(200, "application/json", `{"leases":"none"}`)},
		"undocumented status":  {req("DELETE", "/v1/leases/L1"), reply(200, "text/plain", "gone")},
		"problem without code": {req("GET", "/v1/leases/L1"), reply(404, apitype.ProblemContentType, `{"type":"x","title":"Not Found","status":404}`)},
		"unknown code":         {req("GET", "/v1/leases/L1"), reply(404, apitype.ProblemContentType, `{"type":"x","title":"Not Found","status":404,"code":"gone_fishing"}`)},
		"undocumented route":   {req("GET", "/v1/everything"), reply(200, "application/json", `{}`)},
	} {
		if f := cv.check(c.req, c.resp); f == "" {
			t.Errorf("%s: passed validation", name)
		}
	}
	if got := documentedPath("/v1/leases/L1/files/a/b/c.txt"); got != "/v1/leases/L1/files/a_b_c.txt" {
		t.Errorf("documentedPath: %s", got)
	}
}

// The daemon serves the document it was built with, without a credential.
func TestServesOpenAPI(t *testing.T) {
	d := startDaemon(t)
	status, hdr, body := d.raw("GET", "/v1/openapi.yaml", "", nil, nil)
	if status != http.StatusOK || hdr.Get("Content-Type") != "application/yaml" || !bytes.Equal(body, docs.OpenAPI) {
		t.Fatalf("GET /v1/openapi.yaml: %d %q, %d bytes (want %d)", status, hdr.Get("Content-Type"), len(body), len(docs.OpenAPI))
	}
}
