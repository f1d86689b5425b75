// The console's client of the v1 API. The session cookie is the credential (the browser
// sends it; script cannot read it): no token is ever held here, in a URL or in storage.

export const CSRF_HEADER = "X-Sidecar-Console";

export class APIError extends Error {
  constructor(public status: number, public code: string, detail: string) {
    super(detail || `${status} ${code}`);
  }
}

// onUnauthorized is called when the session is missing or over: the app shows sign-in.
export let onUnauthorized: () => void = () => {};
export function setOnUnauthorized(f: () => void): void {
  onUnauthorized = f;
}

// call sends one request; state-changing ones carry the CSRF header.
export async function call(method: string, path: string, body?: BodyInit | object, headers: Record<string, string> = {}): Promise<Response> {
  const h: Record<string, string> = { ...headers };
  if (method !== "GET" && method !== "HEAD") h[CSRF_HEADER] = "1";
  let b: BodyInit | undefined;
  if (body !== undefined && (typeof body === "string" || body instanceof Blob || body instanceof ArrayBuffer)) {
    b = body as BodyInit;
  } else if (body !== undefined) {
    b = JSON.stringify(body);
    h["Content-Type"] = "application/json";
  }
  const r = await fetch(path, { method, headers: h, body: b, credentials: "same-origin", cache: "no-store" });
  if (r.status === 401) onUnauthorized();
  if (!r.ok) {
    let code = "", detail = "";
    try {
      const p = await r.json();
      code = p.code ?? "";
      detail = p.detail ?? "";
    } catch {
      // not a problem body
    }
    throw new APIError(r.status, code, detail);
  }
  return r;
}

export async function getJSON<T>(path: string): Promise<T> {
  return (await call("GET", path)).json() as Promise<T>;
}

export async function signIn(token: string): Promise<void> {
  const r = await fetch("session", {
    method: "POST",
    headers: { "Content-Type": "application/json", [CSRF_HEADER]: "1" },
    body: JSON.stringify({ token }),
    credentials: "same-origin",
  });
  if (!r.ok) {
    let detail = `${r.status}`;
    try {
      detail = (await r.json()).detail ?? detail;
    } catch {
      // keep the status
    }
    throw new Error(detail);
  }
}

export async function signOut(): Promise<void> {
  await fetch("session", { method: "DELETE", headers: { [CSRF_HEADER]: "1" }, credentials: "same-origin" });
}

// leasePath is /v1/leases/{id} plus a suffix.
export function leasePath(id: string, suffix = ""): string {
  return `/v1/leases/${encodeURIComponent(id)}${suffix}`;
}

// filePath is the files route of a workdir path ("" is the workdir), segment by segment.
export function filePath(id: string, route: string, path: string): string {
  const segs = path.split("/").filter((s) => s !== "").map(encodeURIComponent);
  return leasePath(id, `/${route}/${segs.join("/")}`);
}

export interface Limits { memory_bytes?: number; cpu_millicores?: number; pids?: number; disk_bytes?: number }
export interface Usage { memory_bytes: number; cpu_seconds: number; pids: number; disk_bytes: number; oom_kills: number }
export interface Leftover { pid: number; argv: string[]; started_at: string; rss_bytes: number }
export interface NetworkPolicy { egress: string; allow_out?: string[]; deny_out?: string[] }
export interface NetworkStats { bytes_sent: number; bytes_received: number; connections_allowed: number; connections_denied: number; connections_open: number }
export interface Lease {
  id: string; session_id: string; labels?: Record<string, string>; state: string;
  network: NetworkPolicy; network_stats?: NetworkStats; image?: string;
  created_at: string; expires_at: string; last_activity_at: string; limits: Limits; usage?: Usage;
  process_count: number; leftover_count: number; leftovers?: Leftover[];
}
export interface Info {
  version: string; api_version: string; draining: boolean; default_ttl_seconds: number; cert_not_after?: string;
  capabilities: { isolation: string; cgroups: string; landlock_abi: number; seccomp: boolean; disk_quota: string; layers: string[]; uid_isolation: boolean; network_isolation: boolean };
  limits: { max_leases: number; max_ttl_seconds: number };
  capacity: { active_leases: number; free_leases: number; memory_bytes: number; memory_committed_bytes: number; memory_headroom_bytes: number };
}
export interface Process {
  pid: string; argv: string[]; tty: boolean; state: string; exit_code?: number; signal?: string;
  started_at: string; ended_at?: string; output_offset: number;
}
export interface FileEntry { name: string; type: string; size: number; mode: string; mtime: string; target?: string }
export interface UsageSample { at: string; memory_bytes: number; cpu_seconds: number; pids: number; disk_bytes: number }
