// Package @sidecar-sandbox/client: the TypeScript client of the sidecar daemon for
// Node.js 20+. Types come from docs/openapi.yaml (npm run gen); the websocket framing
// follows docs/api.md.
export * from "./client.js";
export * from "./errors.js";
export * from "./process.js";
