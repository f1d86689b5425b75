// Package @sidecar-sandbox/client: the TypeScript client of the sidecar daemon for
// Node.js 20+. Types come from docs/openapi.yaml (npm run gen); the websocket framing
// follows docs/api.md.
export * from "./client.js";
export * from "./errors.js";
export * from "./process.js";
export * from "./portforward.js";
export * from "./output.js";
export { FleetError, rank, room, memberURL, fnv1a64, FLEET_DOWN_FOR_MS, FLEET_PROBE_TIMEOUT_MS, FLEET_RESOLVE_EVERY_MS } from "./fleet.js";
