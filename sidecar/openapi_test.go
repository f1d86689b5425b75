package sidecar

import (
	"sort"
	"strings"
	"testing"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"

	"github.com/sidecar-sandbox/sidecar/docs"
)

// documentedRoutes are "METHOD /path" of every operation in docs/openapi.yaml.
func documentedRoutes(t *testing.T) map[string]bool {
	t.Helper()
	doc, err := libopenapi.NewDocument(docs.OpenAPI)
	if err != nil {
		t.Fatalf("docs/openapi.yaml: %v", err)
	}
	model, err := doc.BuildV3Model()
	if err != nil {
		t.Fatalf("docs/openapi.yaml: %v", err)
	}
	routes := map[string]bool{}
	for path, item := range model.Model.Paths.PathItems.FromOldest() {
		for method := range item.GetOperations().KeysFromOldest() {
			routes[strings.ToUpper(method)+" "+path] = true
		}
	}
	return routes
}

// registeredRoutes are the routes sidecar/routes.go registers, in the document's spelling:
// a {path...} wildcard is {path} there (OpenAPI has no multi-segment parameter).
func registeredRoutes() map[string]bool {
	s := NewServer(ServerOptions{})
	routes := map[string]bool{}
	for _, p := range s.patterns {
		routes[strings.ReplaceAll(p, "...}", "}")] = true
	}
	return routes
}

// The document and the router describe the same routes: adding or removing one on one
// side only fails here, naming the route and the side it is missing from.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	compareRoutes(t, "docs/openapi.yaml", documentedRoutes(t), registeredRoutes())
}

// compareRoutes fails for every route in only one of the document doc and the router.
func compareRoutes(t *testing.T, doc string, documented, registered map[string]bool) {
	t.Helper()
	if len(registered) < 20 {
		t.Fatalf("only %d routes registered: %v", len(registered), registered)
	}
	var missing []string
	for r := range registered {
		if !documented[r] {
			missing = append(missing, "route "+r+" is registered in sidecar/routes.go but missing from "+doc)
		}
	}
	for r := range documented {
		if !registered[r] {
			missing = append(missing, "route "+r+" is in "+doc+" but not registered in sidecar/routes.go")
		}
	}
	sort.Strings(missing)
	for _, m := range missing {
		t.Error(m)
	}
}

// The document is valid OpenAPI 3.1 by the validator library's own schema check.
func TestOpenAPIDocumentValidates(t *testing.T) {
	doc, err := libopenapi.NewDocument(docs.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	if v := doc.GetVersion(); !strings.HasPrefix(v, "3.1") {
		t.Fatalf("OpenAPI version %q, want 3.1", v)
	}
	v, errs := validator.NewValidator(doc)
	if len(errs) > 0 {
		t.Fatalf("building the validator: %v", errs)
	}
	if ok, verrs := v.ValidateDocument(); !ok {
		for _, e := range verrs {
			t.Errorf("%s: %s", e.Message, e.Reason)
			for _, se := range e.SchemaValidationErrors {
				t.Errorf("  %s at %s", se.Reason, se.FieldPath)
			}
		}
	}
}
