// Package docs embeds the machine-readable API description so that the daemon serves
// the same document the repository keeps (docs/openapi.yaml).
package docs

import _ "embed"

// OpenAPI is docs/openapi.yaml, the OpenAPI 3.1 description of the v1 API.
//
//go:embed openapi.yaml
var OpenAPI []byte
