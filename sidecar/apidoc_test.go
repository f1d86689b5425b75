package sidecar

import (
	"os"
	"strings"
	"testing"
)

// apiDocRoutes are "METHOD /path" of every row of the route table in docs/api.md's
// "## Routes" section, with "…" spelled out as the lease prefix it stands for.
func apiDocRoutes(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile("../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Routes\n")
	if !ok {
		t.Fatal(`docs/api.md has no "## Routes" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	routes := map[string]bool{}
	for _, line := range strings.Split(section, "\n") {
		// | `GET …/files/{path}` | Files |
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		route, _, _ := strings.Cut(line[len("| `"):], "`")
		route = strings.Replace(route, " …/", " /v1/leases/{id}/", 1)
		if routes[route] {
			t.Errorf("docs/api.md lists %s twice", route)
		}
		routes[route] = true
	}
	return routes
}

// The route table of docs/api.md and the router hold the same routes: adding or removing
// one on one side only fails here, naming the route and the side it is missing from.
func TestAPIDocMatchesRoutes(t *testing.T) {
	compareRoutes(t, "docs/api.md", apiDocRoutes(t), registeredRoutes())
}
